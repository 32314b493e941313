#include "server/http_reply.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rpc/status.h"

namespace vaedecode::server {

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;  // the queue, memory or a size limit: the message says which
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:  // the server cut the call (drain)
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

HttpReply ErrorReply(const absl::Status& status) {
  HttpReply reply;
  reply.status = HttpStatusFor(status.code());
  reply.content_type = "application/json";
  nlohmann::json body = {{"error", std::string(status.message())}, {"code", rpc::StatusCodeName(status.code())}};
  // Invalid UTF-8 in a message (an echoed parameter) is replaced, not thrown.
  reply.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return reply;
}

std::string JsonShape(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

HttpReply TensorReply(std::string body, const std::vector<int64_t>& shape, const std::string& dtype) {
  HttpReply reply;
  reply.content_type = "tensor/binary";
  reply.body = std::move(body);
  reply.headers = {{"shape", JsonShape(shape)}, {"dtype", dtype}};
  return reply;
}

void AddCallHeaders(const std::string& request_id, const std::string& mode, double decode_ms, double queue_ms,
                    HttpReply& reply) {
  reply.headers.emplace_back("X-Request-Id", request_id);
  reply.headers.emplace_back("X-Vaedecode-Mode", mode);
  // The group's own times, as the streaming Decode's trailer has them.
  reply.headers.emplace_back("X-Vaedecode-Decode-Ms", absl::StrFormat("%.1f", decode_ms));
  reply.headers.emplace_back("X-Vaedecode-Queue-Ms", absl::StrFormat("%.1f", queue_ms));
}

}  // namespace vaedecode::server
