#pragma once

// The AutoencoderKL encode path: diffusers' VAE `Encoder` (DownEncoderBlock2D
// levels, a mid block with attention, 2·C output channels) and quant_conv
// when configured, for SD 1.x/2.x, SDXL, SD3, FLUX.1 and Z-Image configs;
// FLUX.2 reuses the module (families/flux2/encoder.h).
//
// How it shards by rows (exact mode): the stride-1 convs, GroupNorms and the
// mid-block attention as the decoder's (autoencoder_kl/blocks.h); each
// downsampler is a strided convolution whose band windows read one row of
// the band below. Bands are cut in whole latent rows (RowLevelSpecs), so
// every band but the last starts on a row every level keeps; the last takes
// what the floors leave.

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/autoencoder_kl/blocks.h"
#include "families/autoencoder_kl/config.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::autoencoder_kl {

// diffusers `Encoder` (autoencoders/vae.py) with DownEncoderBlock2D and double_z.
class VaeEncoderImpl : public torch::nn::Module {
 public:
  explicit VaeEncoderImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, Cin, H, W] -> [B, 2·Cz, h, w]

  torch::nn::Conv2d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  UNetMidBlock2D mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};
};
TORCH_MODULE(VaeEncoder);

// The encode-side parameters of AutoencoderKL, named as in its state dict.
class AutoencoderKLEncodeModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLEncodeModuleImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // the moments

  VaeEncoder encoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr};  // 1x1; absent when use_quant_conv is false
};
TORCH_MODULE(AutoencoderKLEncodeModule);

// What the AutoencoderKL-shaped encoders share: shapes, sizes, row levels.
class AutoencoderKLShapedEncoder : public ModuleBackedEncoder {
 public:
  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;

 protected:
  AutoencoderKLShapedEncoder(EncoderInfo info, int64_t downsamplers)
      : ModuleBackedEncoder(std::move(info)), downsamplers_(downsamplers) {}

 private:
  int64_t downsamplers_;
};

class AutoencoderKLEncoder final : public AutoencoderKLShapedEncoder {
 public:
  using Config = AutoencoderKLConfig;
  explicit AutoencoderKLEncoder(AutoencoderKLConfig config);

  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  torch::nn::Module& parameters_module() override { return *module_; }
  AutoencoderKLEncodeModule& module() { return module_; }

 private:
  AutoencoderKLConfig config_;
  AutoencoderKLEncodeModule module_;
};

// Loads AutoencoderKL's encode side from diffusers files (decoder keys ignored by name).
absl::StatusOr<std::unique_ptr<Encoder>> LoadAutoencoderKLEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::autoencoder_kl
