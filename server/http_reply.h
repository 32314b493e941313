#pragma once

// An HTTP reply as the endpoint's protocols build it (remote_decode, the OIP
// HTTP/REST binding), and the one error form they share:
// {"error": message, "code": "INVALID_ARGUMENT"} (tritonclient.http reads
// "error"), with the HTTP status of the code.
//
// Thread-safe: pure functions.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace vaedecode::server {

struct HttpReply {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// {"error": message, "code": name} with the HTTP status for `status`'s code.
HttpReply ErrorReply(const absl::Status& status);
int HttpStatusFor(absl::StatusCode code);

// "[1, 4, 64, 64]": a shape as JSON.
std::string JsonShape(const std::vector<int64_t>& shape);
// The headers every remote_decode / remote_encode reply carries: the
// request id, the mode the group used, its decode (encode) and queue times.
void AddCallHeaders(const std::string& request_id, const std::string& mode, double decode_ms, double queue_ms,
                    HttpReply& reply);

// A raw tensor reply as remote_decode's and remote_encode's postprocess read
// it: `body` with `shape` (a JSON list) and `dtype` (torch's name) headers.
HttpReply TensorReply(std::string body, const std::vector<int64_t>& shape, const std::string& dtype);

}  // namespace vaedecode::server
