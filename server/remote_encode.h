#pragma once

// diffusers' remote_encode() protocol (diffusers.utils.remote_utils), as
// pure translations between its HTTP request/reply and vaedecode.v1, so the
// HTTP endpoint (server/http_endpoint.h) only moves bytes.
//
// Request: POST /encode or /models/NAME/encode whose body is the image:
//   - a PNG or JPEG file, without shape/dtype (what remote_encode sends for a
//     PIL image: pixels p become p / 255 · 2 - 1, a video model's one frame);
//   - or raw little-endian tensor bytes with query parameters shape
//     (repeated) and dtype: float32, float16, bfloat16 for [B, C, (T,) H, W]
//     in [-1, 1] (remote_encode's torch.Tensor), uint8 for pixels [B, (T,) H, W, C].
// scaling_factor / shift_factor: the latent comes back as
// (z - shift_factor) · scaling_factor (each only when given), z the
// posterior's mean (remote_encode's contract: what pipelines scale).
// Extensions, rows of rpc::EncodeOptions() by name: posterior (mean, sample,
// moments), seed, latent_space (raw: the model's own pipeline formula,
// which scaling/shift would contradict), mode.
//
// Reply (what postprocess_encode reads): float32 tensor bytes with `shape`
// (a JSON list) and `dtype` headers; X-Request-Id, X-Vaedecode-Mode and, for
// a sample, X-Vaedecode-Sample-Seed. Errors as {"error": "..."}.
//
// Thread-safe: pure functions.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/collected_output.h"
#include "server/http_query.h"
#include "server/http_reply.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

struct RemoteEncodeCall {
  v1::EncodeRequest request;
  // remote_encode's own normalisation, applied to the reply's latent.
  std::optional<double> scaling_factor;
  std::optional<double> shift_factor;
};

// The EncodeRequest a remote_encode POST asks for, for `model`; `body` is
// moved into the image. INVALID_ARGUMENT naming the parameter when one is
// missing, malformed or contradicts another; size and content checks are
// left to ValidateEncodeRequest.
absl::StatusOr<RemoteEncodeCall> TranslateRemoteEncode(const QueryParams& params, std::string body,
                                                       const v1::ModelInfo& model);

// The reply for a finished encode (an error reply when it failed).
HttpReply BuildRemoteEncodeReply(const RemoteEncodeCall& call, CollectedOutput output);

}  // namespace vaedecode::server
