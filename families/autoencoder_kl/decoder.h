#pragma once

// The AutoencoderKL family: diffusers' AutoencoderKL decode path
// (post_quant_conv when configured, then Decoder) for SD 1.x/2.x, SDXL, SD3,
// FLUX.1 and Z-Image configs.

#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/autoencoder_kl/blocks.h"
#include "families/autoencoder_kl/config.h"
#include "families/decoder.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::autoencoder_kl {

// diffusers `Decoder` (the VAE's, in autoencoders/vae.py) with UpDecoderBlock2D.
class VaeDecoderImpl : public torch::nn::Module {
 public:
  explicit VaeDecoderImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);  // [B, Cz, h, w] -> [B, 3, h*f, w*f]

  torch::nn::Conv2d conv_in{nullptr};
  UNetMidBlock2D mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};
};
TORCH_MODULE(VaeDecoder);

// The decode-side parameters of AutoencoderKL, named as in its state dict.
class AutoencoderKLModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLModuleImpl(const AutoencoderKLConfig& config);
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);

  VaeDecoder decoder{nullptr};
  torch::nn::Conv2d post_quant_conv{nullptr};  // 1x1; absent when use_post_quant_conv is false
};
TORCH_MODULE(AutoencoderKLModule);

class AutoencoderKLDecoder final : public ModuleDecoder<AutoencoderKLModule> {
 public:
  using Config = AutoencoderKLConfig;
  // A decoder with default-initialised weights (callers load or fill them).
  AutoencoderKLDecoder(AutoencoderKLConfig config, std::string config_json);

  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;

  const AutoencoderKLConfig& config() const { return config_; }

 private:
  AutoencoderKLConfig config_;
};

// Loads an AutoencoderKL from diffusers files (encoder keys ignored by name).
absl::StatusOr<std::unique_ptr<Decoder>> LoadAutoencoderKL(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::autoencoder_kl
