#pragma once

// Everything the frontend can check about a DecodeRequest before it is
// queued, so a bad request costs no queue slot and no worker time. The group
// leader validates again (it is the authority on what its decoder takes);
// these checks only need the model's ModelInfo.
//
// Thread-safe: pure functions.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// Bytes per element of a tensor dtype; INVALID_ARGUMENT for UNSPECIFIED or
// an unknown value.
absl::StatusOr<int64_t> DTypeSize(v1::DType dtype);

// INVALID_ARGUMENT with a message that names the field and the problem:
// latent missing, non-floating dtype, rank other than 4 (image models) or 5
// (video models), a dimension < 1, channels other than the model's latent
// channels, byte length != numel × element size, unknown latent_space /
// output_format / mode values, an output format the model's output channels
// cannot be written as, an over-long request id.
absl::Status ValidateDecodeRequest(const v1::DecodeRequest& request, const v1::ModelInfo& model);

}  // namespace vaedecode::server
