#pragma once

// MiniMax-H3's encode side: diffusers' AutoencoderKLMiniMaxH3 `_encode` with
// spatial tiling off. A single frame goes through the encoder alone; a clip
// is padded with copies of its last frame to whole clip_length-frame clips,
// each clip encoded on its own (MiniMaxH3VideoEncoder3d, then quant_conv),
// the moments concatenated and the last token_drop latent frames dropped
// (17·n + 5 frames -> 5·n + 2 latent frames in the release).
//
// diffusers turns spatial tiling on by default for this class (256-pixel
// tiles, linearly blended); this family encodes untiled, exactly, as the
// fixtures were made. Both agree up to 256x256-pixel frames; above that the
// released pipeline's conditioning is the blended-tile one.
//
// The encoder and quant_conv stay float32 whatever dtype the model is
// served in (diffusers' _keep_in_fp32_modules). 8-bit pixels are
// ImageNet-normalised, as the released pipeline feeds them
// (MiniMaxH3ModularPipeline.pixel_mean / pixel_std). `raw` is
// encode_vae_condition's: the latent rounded to float16, then
// (z − latents_mean) / latents_std.
// Exact sharding: families/minimax_h3/blocks.h.

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/minimax_h3/blocks.h"
#include "families/minimax_h3/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::minimax_h3 {

// The encode-side parameters of AutoencoderKLMiniMaxH3: encoder.*, quant_conv.*.
class MiniMaxH3EncodeModuleImpl : public torch::nn::Module {
 public:
  explicit MiniMaxH3EncodeModuleImpl(const MiniMaxH3Config& config);
  // diffusers _encode_clip with tiling off.
  at::Tensor EncodeClip(const at::Tensor& x, LayerOps& ops);

  VideoEncoder encoder{nullptr};
  torch::nn::Conv3d quant_conv{nullptr};  // 1x1x1
};
TORCH_MODULE(MiniMaxH3EncodeModule);

class MiniMaxH3Encoder final : public ModuleBackedEncoder {
 public:
  using Config = MiniMaxH3Config;
  // Throws StatusError for a config diffusers cannot encode with (CheckEncoder).
  explicit MiniMaxH3Encoder(MiniMaxH3Config config);

  // The base checks, and frames large enough for the padding mode.
  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  // Also refuses levels whose downsampler strides rows by other than 2
  // (they pad nothing and shrink the rows by the kernel: no whole-row bands).
  absl::Status CheckExactSharding(const std::vector<int64_t>& image_shape, int world_size) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  // The rows (or columns) of each level of an encode of `pixels` rows: the
  // input, then one per downsampler that strides rows.
  std::vector<int64_t> RowsPerLevel(int64_t pixels) const;
  // Latent frames of one encoded clip of `frames` frames.
  int64_t ClipLatentFrames(int64_t frames) const;

  MiniMaxH3Config config_;
  MiniMaxH3EncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadMiniMaxH3Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::minimax_h3
