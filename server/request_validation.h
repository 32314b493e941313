#pragma once

// Everything the frontend can check about a DecodeRequest before it is
// queued, so a bad request costs no queue slot and no worker time. The group
// leader validates again (it is the authority on what its decoder takes);
// these checks only need the model's ModelInfo.
//
// Thread-safe: pure functions.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// INVALID_ARGUMENT with a message that names the field and the problem:
// the request's options (rpc::ValidateDecodeOptions: ids, enum values,
// JPEG quality, fps, scaling overrides, decode noise), latent missing, the
// tensor's own checks (rpc/latent_tensor.h: non-floating dtype, a dimension
// < 1, byte length != numel × element size), rank other than 4 (image
// models) or 5 (video models), channels other than the model's latent
// channels, or an output format the model's output channels cannot be
// written as (rpc::ValidateOutputFormat).
absl::Status ValidateDecodeRequest(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// The decoded output's size for a latent that passed ValidateDecodeRequest:
// a packed raw latent unpacks by the model's raw patch first; video frames
// follow the model's output frame table (rpc/output_frames.h), the
// causal VAEs' 1 + temporal_factor × (T − 1) when it has none.
struct OutputSize {
  int64_t batch = 0;
  int64_t frames = 1;
  int64_t height = 0;
  int64_t width = 0;
  int64_t pixels() const { return batch * frames * height * width; }
};
// An audio VAE's: the waveform's samples as `height` (width 1, one frame).
OutputSize PredictOutputSize(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// An audio VAE's latent frames L in a request's latent ([B, C, L],
// [B, C, L, M] or the packed raw [B, L, C·M]); 0 for another rank.
int64_t AudioLatentFrames(const v1::DecodeRequest& request, const v1::ModelInfo& model);
// Its latent bins M (0 for a [B, C, L] model).
int64_t AudioLatentBins(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// The bytes of a tensor output (FLOAT32, FLOAT16, UINT8) for a request that
// passed ValidateDecodeRequest: output pixels × the model's output channels
// × the element size. 0 for the encoded formats (PNG, JPEG, MP4), whose
// size is known only once they are encoded.
int64_t PredictTensorOutputBytes(const v1::DecodeRequest& request, const v1::ModelInfo& model);

// What one request may cost, set by flags.
struct AdmissionLimits {
  // Output pixels (batch × frames × height × width) of one request; 0: no
  // limit. The flag's default is kDefaultMaxOutputPixels.
  int64_t max_output_pixels = 0;
  // Latent positions of one frame (rows × columns in the VAE's latent
  // space), for models whose decoder has attention: one attention call runs
  // over them all, and its work grows with their square. 0: no limit.
  int64_t max_attention_tokens = 0;
  // Per-model overrides of max_output_pixels.
  std::map<std::string, int64_t> max_output_pixels_per_model;
  // NaN/Inf latents (or values beyond a float16 decode's range) are decoded
  // instead of refused.
  bool allow_non_finite = false;
};

// The servers' defaults (docs/OPERATIONS.md says why): 2^28 output pixels
// (3 GiB of float32 RGB; the longest clips today's pipelines make, e.g.
// LTX-2's 257 frames of 1216 x 704, are 220 M), and 2^18 attention tokens
// (a 512 x 512 latent: 4096² images from 8x VAEs, 8192² from 16x ones).
inline constexpr int64_t kDefaultMaxOutputPixels = int64_t{1} << 28;
inline constexpr int64_t kDefaultMaxAttentionTokens = int64_t{1} << 18;

// "N" or "N,MODEL=M,..." (N: every model's limit; 0: none). INVALID_ARGUMENT
// naming the bad piece.
absl::StatusOr<AdmissionLimits> ParseOutputPixelLimits(const std::string& flag);

// For a request that passed ValidateDecodeRequest. INVALID_ARGUMENT when its
// output is larger than the model's pixel limit (with both numbers), when
// the model has attention and a frame's latent positions exceed the token
// limit, or when
// its latent holds non-finite values or values that overflow the model's
// float16 decode (with the count and the first element), unless allowed.
absl::Status CheckAdmission(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                            const AdmissionLimits& limits);

// A request's muxed audio (rpc::HasMuxedAudio) against its audio model (the
// catalog's entry for request.audio_model()): an MP4 output, an audio VAE with
// a vocoder, its latent valid for it (ValidateDecodeRequest's checks) and of
// the video latent's batch B, or for a mono model 2B (MiniMax-H3's stereo:
// entries 2b and 2b + 1 are entry b's left and right channels, as its
// pipeline passes the two channels as a batch).
// Then its values, as CheckAdmission checks a latent's (a NaN would make
// noise).
absl::Status ValidateMuxedAudio(const v1::DecodeRequest& request, const absl::StatusOr<v1::ModelInfo>& audio_model,
                                const AdmissionLimits& limits);

// An encode request against its model before queueing, INVALID_ARGUMENT
// naming the field: its enums, one of image / encoded_image, the image
// tensor's own checks (FLOAT32/FLOAT16/BFLOAT16 [B, C, (T,) H, W] or UINT8
// [B, (T,) H, W, C]; rank 4 for image models, 5 for video models; byte
// length), moments in raw space, a tiled mode, an exact mode on a group of
// one rank (`group_size`), and the pixel and attention limits (the image's
// pixels against --max_output_pixels, its latent positions against
// --max_attention_tokens). The encoder's own rules (channels, sizes) are
// the leader's.
absl::Status ValidateEncodeRequest(const v1::EncodeRequest& request, const v1::ModelInfo& model, int group_size,
                                   const AdmissionLimits& limits);

}  // namespace vaedecode::server
