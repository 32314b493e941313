#pragma once

// One encode's input as a caller sends it, the image's conversion into the
// encoder's input, and the posterior's conversion into what the caller asked
// for (mean, a seeded sample or the moments; VAE or the denoiser's space).
// Errors are Statuses; nothing throws past these functions.

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/encoder.h"
#include "families/layer_ops.h"
#include "families/posterior.h"

namespace vaedecode::worker {

struct EncodeJob {
  at::Tensor image;  // NCHW or NCTHW in [-1, 1], any float dtype and device
  families::PosteriorOutput posterior = families::PosteriorOutput::kMean;
  std::optional<uint64_t> seed;  // kSample's generator seed; a random one when unset
  // kRaw: normalised as the family's pipeline feeds its denoiser (mean or
  // sample only; moments stay in VAE space).
  families::LatentSpace latent_space = families::LatentSpace::kVae;
  // The image came from 8-bit pixels p as p / 255 · 2 − 1 (PNG, JPEG,
  // UINT8): PrepareImage maps it to the model's pixel convention when that
  // is another (EncoderInfo::pixels). A float image is the encoder's input
  // as it is, as vae.encode takes it.
  bool from_pixels = false;
};

struct EncodeResult {
  at::Tensor latent;             // mean or sample; undefined for moments
  at::Tensor mean;               // moments only
  at::Tensor logvar;             // moments only, clamped to [-30, 20]
  std::optional<uint64_t> seed;  // the sample's seed
};

// INVALID_ARGUMENT for an image the model cannot encode or options that do
// not go together (raw moments). A video encoder takes a 4-D image (a PNG
// or JPEG) as a one-frame clip.
absl::Status CheckEncodeJob(const families::Encoder& encoder, const EncodeJob& job);

// CheckEncodeJob, then the image in the encoder's dtype, contiguous on its device.
absl::StatusOr<at::Tensor> PrepareImage(const families::Encoder& encoder, const EncodeJob& job);

// The encoder's moments for a prepared image (or a band of one) through `ops`.
absl::StatusOr<at::Tensor> EncodePrepared(families::Encoder& encoder, const at::Tensor& image, families::LayerOps& ops);

// The job's output from the whole image's moments, in float32 on the CPU.
absl::StatusOr<EncodeResult> FinishEncode(const families::Encoder& encoder, const at::Tensor& moments,
                                          const EncodeJob& job);

// PrepareImage, EncodePrepared, FinishEncode: one dense encode.
absl::StatusOr<EncodeResult> RunEncode(families::Encoder& encoder, const EncodeJob& job, families::LayerOps& ops);

}  // namespace vaedecode::worker
