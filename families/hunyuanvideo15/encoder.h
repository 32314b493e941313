#pragma once

// HunyuanVideo 1.5's encode side: diffusers' AutoencoderKLHunyuanVideo15
// `_encode` with tiling off, the whole clip through HunyuanVideo15Encoder3D
// at once (no quant_conv). Its downsamplers pack 2x2 (2x2x2) pixels into
// channels, so sides must be multiples of the spatial factor and clips
// 1 + temporal factor·k frames (diffusers' reshapes fail otherwise).
// Exact sharding: families/hunyuanvideo15/blocks.h.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/hunyuanvideo15/blocks.h"
#include "families/hunyuanvideo15/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanvideo15 {

// The encode-side parameters of AutoencoderKLHunyuanVideo15: encoder.*.
class HunyuanVideo15EncodeModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanVideo15EncodeModuleImpl(const HunyuanVideo15Config& config);

  Encoder3D encoder{nullptr};
};
TORCH_MODULE(HunyuanVideo15EncodeModule);

class HunyuanVideo15Encoder final : public ModuleBackedEncoder {
 public:
  using Config = HunyuanVideo15Config;
  // Throws StatusError for a config diffusers cannot encode with (CheckEncoder).
  explicit HunyuanVideo15Encoder(HunyuanVideo15Config config);

  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;  // z * scaling_factor
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  HunyuanVideo15Config config_;
  HunyuanVideo15EncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanVideo15Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::hunyuanvideo15
