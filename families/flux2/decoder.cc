#include "families/flux2/decoder.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/autoencoder_kl/blocks.h"
#include "families/flux2/encoder.h"
#include "families/status_error.h"
#include "families/weight_loading.h"

namespace vaedecode::families::flux2 {

AutoencoderKLFlux2ModuleImpl::AutoencoderKLFlux2ModuleImpl(const Flux2Config& c) {
  decoder = register_module("decoder", autoencoder_kl::VaeDecoder(c.decoder));
  if (c.decoder.use_post_quant_conv) {
    const int64_t z = c.latent_channels();
    post_quant_conv = register_module("post_quant_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(z, z, 1)));
  }
  bn = register_module("bn", LatentBatchNorm(c.patched_channels()));
}

at::Tensor AutoencoderKLFlux2ModuleImpl::forward(const at::Tensor& z, LayerOps& ops) {
  const at::Tensor x = post_quant_conv ? nn::RunConv2d(ops, post_quant_conv, z) : z;
  return decoder->forward(x, ops);
}

Flux2Decoder::Flux2Decoder(Flux2Config config, std::string config_json)
    : ModuleDecoder(AutoencoderKLFlux2Module(config), {}, /*latent_halo_rows=*/1), config_(std::move(config)) {
  info_.family = "flux2";
  info_.diffusers_class = "AutoencoderKLFlux2";
  info_.config_json = std::move(config_json);
  info_.unread_config_keys = config_.unread_keys;
  info_.latent_channels = config_.latent_channels();
  info_.raw_latent_channels = config_.patched_channels();
  info_.raw_patch = config_.patch_h;  // square patches (checked by the config)
  info_.out_channels = config_.decoder.out_channels;
  info_.spatial_factor = config_.decoder.spatial_factor();
  info_.scaling_factor = 1.0;
  info_.force_upcast = config_.decoder.force_upcast;
  // AutoencoderKLFlux2.tiled_decode: tile_latent_min_size = sample_size / 2^(levels-1), overlap 0.25.
  info_.stock_tile = std::max<int64_t>(1, config_.decoder.sample_size / config_.decoder.spatial_factor());
  info_.stock_stride = std::max<int64_t>(1, info_.stock_tile * 3 / 4);
  info_.raw_to_vae_formula = absl::StrCat(
      "z: [B, ", config_.patched_channels(), ", h, w]; x = z * sqrt(bn.running_var + ", config_.batch_norm_eps,
      ") + bn.running_mean per channel; unpatchify 2x2: x.reshape(B, ", config_.latent_channels(),
      ", 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(B, ", config_.latent_channels(), ", 2h, 2w)");
}

absl::Status Flux2Decoder::ValidateLatent(const at::Tensor& latent) const {
  if (latent.dim() == 4 && latent.size(1) == config_.patched_channels()) {
    // A raw latent: every other check as for a VAE-space one.
    return Decoder::ValidateLatent(latent.narrow(1, 0, config_.latent_channels()));
  }
  absl::Status status = Decoder::ValidateLatent(latent);
  if (!status.ok() && latent.dim() == 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(status.message(), " (or ", config_.patched_channels(), " for a raw FLUX.2 pipeline latent)"));
  }
  return status;
}

at::Tensor Flux2Decoder::ToVaeSpace(const at::Tensor& raw) const {
  if (raw.size(1) != config_.patched_channels()) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("a raw FLUX.2 latent has ", config_.patched_channels(), " channels (", config_.latent_channels(),
                     " latent channels in 2x2 patches); this one has ", raw.size(1),
                     ": decode it as a VAE-space latent (latent space vae)")));
  }
  return UnpatchifyLatents(module_->bn->Denormalize(raw, config_.batch_norm_eps), config_.patch_h, config_.patch_w);
}

at::Tensor Flux2Decoder::Decode(const at::Tensor& z, LayerOps& ops) {
  if (z.size(1) != config_.latent_channels()) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("the FLUX.2 decoder takes ", config_.latent_channels(), "-channel latents; a ", z.size(1),
                     "-channel latent is the denoiser's 2x2-patched form: decode it with latent space raw")));
  }
  at::NoGradGuard no_grad;
  return module_->forward(z.to(dtype()), ops);
}

void Flux2Decoder::ConvertWeights(at::ScalarType dtype) {
  module_->decoder->to(dtype);
  if (module_->post_quant_conv) module_->post_quant_conv->to(dtype);
}

std::vector<int64_t> Flux2Decoder::OutputShape(const std::vector<int64_t>& latent_shape) const {
  if (latent_shape.size() == 4 && latent_shape[1] == config_.patched_channels()) {
    return Decoder::OutputShape({latent_shape[0], config_.latent_channels(), latent_shape[2] * config_.patch_h,
                                 latent_shape[3] * config_.patch_w});
  }
  return Decoder::OutputShape(latent_shape);
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadFlux2(const ModelFiles& files, const LoadOptions& options) {
  // decode() never touches the encoder side; num_batches_tracked (I64) only
  // counts training steps.
  return LoadModuleDecoder<Flux2Decoder>(files, options, {{"encoder.", "quant_conv."}, {"bn.num_batches_tracked"}});
}

void Register(Registry& registry) {
  // The latent BatchNorm of the 2x2-patched latent.
  registry.Register({"flux2",
                     {"AutoencoderKLFlux2"},
                     &LoadFlux2,
                     {{{"AutoencoderKLFlux2"}, {{"bn.running_mean", 1}, {"decoder.conv_in.weight", 4}}, {}}},
                     &LoadFlux2Encoder});
}

}  // namespace vaedecode::families::flux2
