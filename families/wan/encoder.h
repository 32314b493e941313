#pragma once

// The Wan family's encode side: diffusers' AutoencoderKLWan `_encode` (the
// Wan 2.2 patchify, WanEncoder3d over the first frame alone and then
// 4-frame chunks with a causal feature cache, quant_conv) for Wan 2.1 and
// Wan 2.2 configs; Qwen-Image (families/qwenimage) encodes with the same
// blocks under its own config.
//
// How it shards by rows (exact mode): see families/wan/blocks.h. Bands are
// cut in whole latent rows at every level (RowLevels), so the patchify and
// Wan 2.2's AvgDown3D shortcuts stay inside a band.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/registry.h"
#include "families/wan/config.h"

namespace vaedecode::families::wan {

class AutoencoderKLWanEncodeImpl;

class WanEncoder final : public ModuleBackedEncoder {
 public:
  // An encoder with default-initialised weights (callers load or fill
  // them). INVALID_ARGUMENT for configs diffusers cannot encode with
  // (attention at attn_scales, a video encoder's temporal factor other than
  // its 4-frame chunks).
  static absl::StatusOr<std::unique_ptr<WanEncoder>> Create(const WanFamily& family, WanConfig config);
  ~WanEncoder() override;

  // Also: 1 + 4·k frames (one for an image-only model); Wan 2.2 (patchify, AvgDown3D) needs sides that
  // are multiples of its spatial factor, Wan 2.1 floors like AutoencoderKL.
  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  // (z - latents_mean) · (1 / latents_std), or / latents_std for Qwen-Image, per channel.
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;

  torch::nn::Module& parameters_module() override;

 private:
  WanEncoder(const WanFamily& family, WanConfig config);

  WanConfig config_;
  bool divides_by_std_;
  std::shared_ptr<AutoencoderKLWanEncodeImpl> module_;
};

// Builds a `family` encoder for `config` and loads it strictly from `files`
// (decoder.* and post_quant_conv.* ignored by name).
absl::StatusOr<std::unique_ptr<Encoder>> LoadWanFamilyEncoder(const WanFamily& family, const WanConfig& config,
                                                              const ModelFiles& files, const LoadOptions& options);

// Loads AutoencoderKLWan's encode side from diffusers files.
absl::StatusOr<std::unique_ptr<Encoder>> LoadWanEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::wan
