#include "families/flux2/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/module_encoder.h"

namespace vaedecode::families::flux2 {

AutoencoderKLFlux2EncodeModuleImpl::AutoencoderKLFlux2EncodeModuleImpl(const Flux2Config& c) {
  encoder = register_module("encoder", autoencoder_kl::VaeEncoder(c.encoder));
  if (c.encoder.use_quant_conv) {
    const int64_t moments = 2 * c.latent_channels();
    quant_conv = register_module("quant_conv", nn::MakeConv2d(moments, moments, 1));
  }
  bn = register_module("bn", LatentBatchNorm(c.patched_channels()));
}

at::Tensor AutoencoderKLFlux2EncodeModuleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = encoder->forward(x, ops);
  return quant_conv ? nn::RunConv2d(ops, quant_conv, h) : h;
}

Flux2Encoder::Flux2Encoder(Flux2Config config)
    : AutoencoderKLShapedEncoder({}, static_cast<int64_t>(config.encoder.block_out_channels.size()) - 1),
      config_(std::move(config)),
      module_(config_) {
  info_.family = "flux2";
  info_.diffusers_class = "AutoencoderKLFlux2";
  info_.in_channels = config_.encoder.in_channels;
  info_.latent_channels = config_.latent_channels();
  info_.spatial_factor = config_.encoder.spatial_factor();
  info_.vae_to_raw_formula =
      absl::StrCat("z: [B, ", config_.latent_channels(),
                   ", h, w] (h, w even); patchify 2x2: z.view(B, C, h/2, 2, w/2, 2)"
                   ".permute(0, 1, 3, 5, 2, 4).reshape(B, ",
                   config_.patched_channels(), ", h/2, w/2); then (x - bn.running_mean) / sqrt(bn.running_var + ",
                   config_.batch_norm_eps, ") per channel");
  AdoptModule(*module_);
}

at::Tensor Flux2Encoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->forward(image.to(dtype()), ops);
}

absl::Status Flux2Encoder::CheckRawLatentShape(const std::vector<int64_t>& shape) const {
  if (shape.size() == 4 && shape[2] % config_.patch_h == 0 && shape[3] % config_.patch_w == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("a raw FLUX.2 latent packs 2x2 patches, so the latent's sides must be even; this image encodes to [",
                   absl::StrJoin(shape, ", "), "] (image sides multiples of ", 2 * info_.spatial_factor,
                   "): ask for latent_space vae, or resize the image"));
}

at::Tensor Flux2Encoder::ToRawSpace(const at::Tensor& z) const {
  return module_->bn->Normalize(PatchifyLatents(z, config_.patch_h, config_.patch_w), config_.batch_norm_eps);
}

void Flux2Encoder::ConvertWeights(at::ScalarType dtype) {
  module_->encoder->to(dtype);
  if (module_->quant_conv) module_->quant_conv->to(dtype);
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadFlux2Encoder(const ModelFiles& files, const LoadOptions& options) {
  return LoadModuleEncoder<Flux2Encoder>(files, options,
                                         {{"decoder.", "post_quant_conv."}, {"bn.num_batches_tracked"}});
}

}  // namespace vaedecode::families::flux2
