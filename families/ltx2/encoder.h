#pragma once

// LTX-2's encode side: diffusers' AutoencoderKLLTX2Video `_encode` with tiling
// and framewise encoding off, the whole clip through LTX2VideoEncoder3d at
// once (no quant_conv), and LTX2ImageToVideoPipeline's normalisation for
// `raw`. Its folding downsamplers need sides that are multiples of the
// spatial factor and clips of 1 + temporal factor·k frames (diffusers'
// reshapes fail otherwise). Exact sharding: families/ltx2/blocks.h.

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/ltx2/blocks.h"
#include "families/ltx2/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::ltx2 {

// The encode-side state of AutoencoderKLLTX2Video: encoder.*, latents_mean,
// latents_std.
class LTX2EncodeModuleImpl : public torch::nn::Module {
 public:
  explicit LTX2EncodeModuleImpl(const LTX2Config& config);

  LTX2VideoEncoder3d encoder{nullptr};
  at::Tensor latents_mean;  // [latent_channels]
  at::Tensor latents_std;   // [latent_channels]
};
TORCH_MODULE(LTX2EncodeModule);

class LTX2Encoder final : public ModuleBackedEncoder {
 public:
  using Config = LTX2Config;
  // Throws StatusError for a config diffusers cannot encode with (CheckEncoder).
  explicit LTX2Encoder(LTX2Config config);

  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  // LTX2ImageToVideoPipeline._normalize_latents: (z - latents_mean) · 1.0 /
  // latents_std. The pipeline passes no scaling_factor (1.0), unlike the
  // decode side's division by config.scaling_factor; released configs have 1.0.
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  void ConvertWeights(at::ScalarType dtype) override;  // latents_mean / latents_std stay float32
  // The rows (or columns) of each level of an encode of `pixels` rows: the
  // input, the patchified input, then one per spatial downsampler.
  std::vector<int64_t> RowsPerLevel(int64_t pixels) const;

  LTX2Config config_;
  LTX2EncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadLTX2Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::ltx2
