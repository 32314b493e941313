#pragma once

// The checks of a DecodeRequest's options against the model's ModelInfo that
// need no latent bytes: the server runs them before queueing
// (server/request_validation.h, with its latent checks), and the CLI on
// the request it builds from its flags. INVALID_ARGUMENT naming the field.
//
// Thread-safe: pure functions.

#include <cstddef>

#include "absl/status/status.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// The longest request_id a request may carry (decodes and encodes).
inline constexpr size_t kMaxRequestIdLength = 128;

// The scaling_factor/shift_factor overrides: a shift needs a scale; both
// finite, the scale non-zero; only for latent_space RAW and models whose raw
// latent is not packed.
absl::Status ValidateLatentScaling(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// decode_timestep / decode_noise_scale / noise_seed: only for
// timestep-conditioned models.
absl::Status ValidateDecodeNoise(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// An over-long request id; every option within its range
// (rpc/request_options.h: CheckOptionRanges); then ValidateLatentScaling
// and ValidateDecodeNoise.
absl::Status ValidateDecodeOptions(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// An output format the model's output cannot be written as (the channels
// and kinds of rpc/output_formats.h), or audio_output MEL asked of a model
// that is not an audio VAE.
absl::Status ValidateOutputFormat(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// Whether a request carries an audio latent to mux into its MP4.
bool HasMuxedAudio(const v1::DecodeRequest& request);

// The decode of a request's muxed audio, as a request of its own: a copy of
// the audio latent (small), audio_model, audio_latent_space, the waveform as
// float32. What the server validates and the leader decodes.
v1::DecodeRequest MuxedAudioRequest(const v1::DecodeRequest& request);

}  // namespace vaedecode::rpc
