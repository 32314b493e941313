#pragma once

// The FLUX.2 family: diffusers' AutoencoderKLFlux2 decode path
// (post_quant_conv, then AutoencoderKL's VAE Decoder, reused from
// families/autoencoder_kl), plus Flux2Pipeline's latent handling for `raw`
// latents: the denoiser-side latent [B, 4·C, h, w] is de-normalised with the
// VAE's latent BatchNorm running statistics and unpatchified 2x2 into the
// decoder input [B, C, 2h, 2w].

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/autoencoder_kl/decoder.h"
#include "families/decoder.h"
#include "families/flux2/blocks.h"
#include "families/flux2/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::flux2 {

// The decode-side state of AutoencoderKLFlux2, named as in its state dict:
// decoder.*, post_quant_conv.*, bn.running_mean / bn.running_var.
class AutoencoderKLFlux2ModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLFlux2ModuleImpl(const Flux2Config& config);
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);  // [B, C, h, w] -> [B, 3, h·f, w·f]

  autoencoder_kl::VaeDecoder decoder{nullptr};
  torch::nn::Conv2d post_quant_conv{nullptr};  // 1x1; absent when use_post_quant_conv is false
  LatentBatchNorm bn{nullptr};
};
TORCH_MODULE(AutoencoderKLFlux2Module);

class Flux2Decoder final : public ModuleDecoder<AutoencoderKLFlux2Module> {
 public:
  using Config = Flux2Config;
  // A decoder with default-initialised weights (callers load or fill them).
  Flux2Decoder(Flux2Config config, std::string config_json);

  // Accepts VAE-space latents [B, C, h, w] and raw ones [B, 4·C, h, w] (the
  // decoder does not know the latent space here; Decode and ToVaeSpace
  // reject the other layout with a message naming the right space).
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  // Flux2Pipeline: z * sqrt(bn.running_var + eps) + bn.running_mean, then
  // the 2x2 unpatchify. `raw`: [B, 4·C, h, w] -> [B, C, 2h, 2w], in fp32.
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  // For [B, 4·C, h, w] (raw) the output is that of [B, C, 2h, 2w].
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& latent_shape) const override;

  const Flux2Config& config() const { return config_; }

 private:
  // The decoder's weights; the BatchNorm statistics stay fp32 (ToVaeSpace
  // runs on the fp32 raw latent, as RunDecode hands it over).
  void ConvertWeights(at::ScalarType dtype) override;

  Flux2Config config_;
};

// Loads an AutoencoderKLFlux2 from diffusers files (encoder.*, quant_conv.*
// and bn.num_batches_tracked ignored by name).
absl::StatusOr<std::unique_ptr<Decoder>> LoadFlux2(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::flux2
