#include "families/autoencoder_kl/decoder.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/autoencoder_kl/encoder.h"
#include "families/weight_loading.h"

namespace vaedecode::families::autoencoder_kl {
namespace {

constexpr double kEps = 1e-6;  // diffusers' VAE Decoder: resnet_eps and conv_norm_out eps

}  // namespace

VaeDecoderImpl::VaeDecoderImpl(const AutoencoderKLConfig& c) {
  const std::vector<int64_t>& widths = c.block_out_channels;
  const int64_t groups = c.norm_num_groups;
  conv_in = register_module(
      "conv_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.latent_channels, widths.back(), 3).padding(1)));
  mid_block = register_module("mid_block", UNetMidBlock2D(widths.back(), groups, kEps, c.mid_block_add_attention));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  int64_t out_width = widths.back();
  const int64_t levels = static_cast<int64_t>(widths.size());
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t in_width = out_width;
    out_width = widths[levels - 1 - i];
    up_blocks->push_back(UpDecoderBlock2D(in_width, out_width, c.layers_per_block + 1, groups, kEps,
                                          /*add_upsample=*/i != levels - 1));
  }
  conv_norm_out = register_module("conv_norm_out",
                                  torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, widths.front()).eps(kEps)));
  conv_out = register_module("conv_out",
                             torch::nn::Conv2d(torch::nn::Conv2dOptions(widths.front(), c.out_channels, 3).padding(1)));
}

at::Tensor VaeDecoderImpl::forward(const at::Tensor& z, LayerOps& ops) {
  at::Tensor h = nn::RunConv2d(ops, conv_in, z);
  h = mid_block->forward(h, ops);
  for (const auto& block : *up_blocks) h = block->as<UpDecoderBlock2DImpl>()->forward(h, ops);
  h = at::silu(nn::RunGroupNorm(ops, conv_norm_out, h));
  return nn::RunConv2d(ops, conv_out, h);
}

AutoencoderKLModuleImpl::AutoencoderKLModuleImpl(const AutoencoderKLConfig& c) {
  decoder = register_module("decoder", VaeDecoder(c));
  if (c.use_post_quant_conv) {
    post_quant_conv = register_module(
        "post_quant_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.latent_channels, c.latent_channels, 1)));
  }
}

at::Tensor AutoencoderKLModuleImpl::forward(const at::Tensor& z, LayerOps& ops) {
  const at::Tensor x = post_quant_conv ? nn::RunConv2d(ops, post_quant_conv, z) : z;
  return decoder->forward(x, ops);
}

AutoencoderKLDecoder::AutoencoderKLDecoder(AutoencoderKLConfig config, std::string config_json)
    : ModuleDecoder(AutoencoderKLModule(config), {}, /*latent_halo_rows=*/1), config_(std::move(config)) {
  info_.family = "autoencoder_kl";
  info_.diffusers_class = "AutoencoderKL";
  info_.config_json = std::move(config_json);
  info_.unread_config_keys = config_.unread_keys;
  info_.latent_channels = config_.latent_channels;
  info_.out_channels = config_.out_channels;
  info_.spatial_factor = config_.spatial_factor();
  info_.scaling_factor = config_.scaling_factor;
  info_.shift_factor = config_.shift_factor;
  info_.force_upcast = config_.force_upcast;
  // AutoencoderKL.tiled_decode: tile_sample_min_size = sample_size, overlap 0.25.
  info_.stock_tile = std::max<int64_t>(1, config_.sample_size / config_.spatial_factor());
  info_.stock_stride = std::max<int64_t>(1, info_.stock_tile * 3 / 4);
  info_.raw_to_vae_formula = config_.latents_mean   ? "z * latents_std / scaling_factor + latents_mean"
                             : config_.shift_factor ? "z / scaling_factor + shift_factor"
                                                    : "z / scaling_factor";
}

at::Tensor AutoencoderKLDecoder::ToVaeSpace(const at::Tensor& raw) const {
  // As diffusers' pipelines do it (SDXL with statistics; SD/FLUX/SD3 without).
  if (config_.latents_mean) {
    const auto opts = at::TensorOptions().dtype(raw.scalar_type()).device(raw.device());
    const int64_t c = config_.latent_channels;
    at::Tensor mean = at::tensor(*config_.latents_mean, at::kDouble).to(opts).view({1, c, 1, 1});
    at::Tensor std = at::tensor(*config_.latents_std, at::kDouble).to(opts).view({1, c, 1, 1});
    return raw * std / config_.scaling_factor + mean;
  }
  at::Tensor z = raw / config_.scaling_factor;
  if (config_.shift_factor) z = z + *config_.shift_factor;
  return z;
}

at::Tensor AutoencoderKLDecoder::Decode(const at::Tensor& z, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->forward(z.to(dtype()), ops);
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadAutoencoderKL(const ModelFiles& files, const LoadOptions& options) {
  // decode() never touches the encoder side; those keys are ignored by name.
  return LoadModuleDecoder<AutoencoderKLDecoder>(files, options, {{"encoder.", "quant_conv."}, {}});
}

void Register(Registry& registry) {
  registry.Register(
      {"autoencoder_kl",
       {"AutoencoderKL"},
       &LoadAutoencoderKL,
       {{{"AutoencoderKL"}, {{"decoder.conv_in.weight", 4}, {"decoder.conv_norm_out.weight", 1}}, {"bn.running_mean"}}},
       &LoadAutoencoderKLEncoder});
}

}  // namespace vaedecode::families::autoencoder_kl
