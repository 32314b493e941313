#pragma once

// HunyuanImage-2.1's encode side: diffusers' AutoencoderKLHunyuanImage
// `_encode` with tiling off, the encoder alone (no quant_conv). Its
// downsamplers fold 2x2 pixels into channels, so the image's sides must be
// multiples of 2^downsamplers (diffusers' reshape fails otherwise).
// Exact sharding: families/hunyuanimage/blocks.h.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/hunyuanimage/blocks.h"
#include "families/hunyuanimage/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanimage {

// The encode-side parameters of AutoencoderKLHunyuanImage: encoder.*.
class HunyuanImageEncodeModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanImageEncodeModuleImpl(const HunyuanImageConfig& config);

  Encoder2D encoder{nullptr};
};
TORCH_MODULE(HunyuanImageEncodeModule);

class HunyuanImageEncoder final : public ModuleBackedEncoder {
 public:
  using Config = HunyuanImageConfig;
  // Throws StatusError for a config diffusers cannot encode with (CheckEncoder).
  explicit HunyuanImageEncoder(HunyuanImageConfig config);

  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;  // z * scaling_factor
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  HunyuanImageConfig config_;
  HunyuanImageEncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanImageEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::hunyuanimage
