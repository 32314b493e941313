#pragma once

// The checks of a DecodeRequest's options against the model's ModelInfo that
// need no latent bytes: the server runs them before queueing
// (server/request_validation.h, with its latent checks), and the CLI on
// the request it builds from its flags. INVALID_ARGUMENT naming the field.
//
// Thread-safe: pure functions.

#include "absl/status/status.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// The scaling_factor/shift_factor overrides: a shift needs a scale; both
// finite, the scale non-zero; only for latent_space RAW and models whose raw
// latent is not packed.
absl::Status ValidateLatentScaling(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// decode_timestep / decode_noise_scale / noise_seed: only for
// timestep-conditioned models; finite and >= 0.
absl::Status ValidateDecodeNoise(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// An over-long request id; unknown latent_space / mode / output_format
// values; a JPEG quality outside 0..100 or an fps outside 0..240; then
// ValidateLatentScaling and ValidateDecodeNoise.
absl::Status ValidateDecodeOptions(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// An output format the model's output channels cannot be written as (PNG and
// UINT8: 1, 3 or 4; JPEG: 1 or 3; MP4: a video model with 3).
absl::Status ValidateOutputFormat(const v1::DecodeRequest& request, const v1::ModelInfo& model);

}  // namespace vaedecode::rpc
