#pragma once

// AutoencoderKLFlux2's encode path: AutoencoderKL's VAE Encoder (reused from
// families/autoencoder_kl/encoder.h, built from block_out_channels) and
// quant_conv, plus Flux2Pipeline._encode_vae_image's latent handling for
// `raw`: the 2x2 patchify and the latent BatchNorm's normalisation.
// Sharding is AutoencoderKL's (autoencoder_kl/encoder.h).

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/autoencoder_kl/encoder.h"
#include "families/flux2/blocks.h"
#include "families/flux2/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::flux2 {

// encoder.*, quant_conv.*, bn.running_mean / bn.running_var.
class AutoencoderKLFlux2EncodeModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLFlux2EncodeModuleImpl(const Flux2Config& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // the moments

  autoencoder_kl::VaeEncoder encoder{nullptr};
  torch::nn::Conv2d quant_conv{nullptr};  // 1x1; absent when use_quant_conv is false
  LatentBatchNorm bn{nullptr};
};
TORCH_MODULE(AutoencoderKLFlux2EncodeModule);

class Flux2Encoder final : public autoencoder_kl::AutoencoderKLShapedEncoder {
 public:
  using Config = Flux2Config;
  explicit Flux2Encoder(Flux2Config config);

  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  // 2x2 patchify, then (x - bn.running_mean) / sqrt(bn.running_var + eps):
  // [B, C, h, w] -> [B, 4·C, h/2, w/2].
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  absl::Status CheckRawLatentShape(const std::vector<int64_t>& latent_shape) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  void ConvertWeights(at::ScalarType dtype) override;  // the BatchNorm statistics stay float32

  Flux2Config config_;
  AutoencoderKLFlux2EncodeModule module_;
};

// Loads AutoencoderKLFlux2's encode side (decoder keys and bn.num_batches_tracked ignored by name).
absl::StatusOr<std::unique_ptr<Encoder>> LoadFlux2Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::flux2
