#pragma once

// The model-independent checks of a request's latent tensor (dtype, shape,
// byte length), written once for both sides of the process boundary: the
// server refuses a bad request with them before queueing it
// (server/request_validation.h, which adds the model's checks), and the
// group leader holds them as the invariant its copy into a tensor relies on.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// Bytes per element of a tensor dtype; INVALID_ARGUMENT for UNSPECIFIED or
// an unknown value.
absl::StatusOr<int64_t> DTypeSize(v1::DType dtype);

// Each INVALID_ARGUMENT names the field. The dtype: FLOAT32, FLOAT16 or
// BFLOAT16.
absl::Status CheckLatentDtype(const v1::Tensor& latent);
// The element count of `shape`: every dimension >= 1, at most 2^40
// elements (so numel × element size never overflows int64). The
// INVALID_ARGUMENT names `field`.
absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> shape, absl::string_view field);
// The latent's element count (CountElements of latent.shape).
absl::StatusOr<int64_t> CountLatentElements(const v1::Tensor& latent);
// The data: numel × element size bytes.
absl::Status CheckLatentBytes(const v1::Tensor& latent, int64_t numel);

// All three, in that order; returns numel.
absl::StatusOr<int64_t> ValidateLatentTensor(const v1::Tensor& latent);

}  // namespace vaedecode::rpc
