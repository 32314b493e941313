#pragma once

// Hunyuan Image 3's encode side: the release's `encode` of an image, which
// expands it to ffactor_temporal identical frames that its encoder folds
// back into one latent frame; NCHW images in, NCHW moments out.

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/hunyuanimage3/blocks.h"
#include "families/hunyuanimage3/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanimage3 {

// The encode-side parameters of AutoencoderKLConv3D: encoder.*.
class HunyuanImage3EncodeModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanImage3EncodeModuleImpl(const HunyuanImage3Config& config);

  Encoder3D encoder{nullptr};
};
TORCH_MODULE(HunyuanImage3EncodeModule);

class HunyuanImage3Encoder final : public ModuleBackedEncoder {
 public:
  using Config = HunyuanImage3Config;
  // Throws StatusError for a config the release cannot encode images with (CheckEncoder).
  explicit HunyuanImage3Encoder(HunyuanImage3Config config);

  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;  // (z - shift_factor) * scaling_factor
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  HunyuanImage3Config config_;
  HunyuanImage3EncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanImage3Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::hunyuanimage3
