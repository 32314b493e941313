#include "families/autoencoder_kl/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/module_encoder.h"
#include "families/status_error.h"

namespace vaedecode::families::autoencoder_kl {
namespace {

constexpr double kEps = 1e-6;  // diffusers' VAE Encoder: resnet_eps and conv_norm_out eps

}  // namespace

VaeEncoderImpl::VaeEncoderImpl(const AutoencoderKLConfig& c) {
  const std::vector<int64_t>& widths = c.block_out_channels;
  if (c.down_block_types.size() != widths.size()) {
    throw StatusError(
        absl::InvalidArgumentError(absl::StrCat("the encoder's \"down_block_types\" has ", c.down_block_types.size(),
                                                " entries but its \"block_out_channels\" has ", widths.size())));
  }
  for (const std::string& t : c.down_block_types) {
    if (t != "DownEncoderBlock2D") {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("down block type \"", t, "\" is not supported (only DownEncoderBlock2D)")));
    }
  }
  const int64_t groups = c.norm_num_groups;
  conv_in = register_module("conv_in", nn::MakeConv2d(c.in_channels, widths.front(), 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  int64_t out_width = widths.front();
  const int64_t levels = static_cast<int64_t>(widths.size());
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t in_width = out_width;
    out_width = widths[i];
    down_blocks->push_back(DownEncoderBlock2D(in_width, out_width, c.layers_per_block, groups, kEps,
                                              /*add_downsample=*/i != levels - 1));
  }
  mid_block = register_module("mid_block", UNetMidBlock2D(widths.back(), groups, kEps, c.mid_block_add_attention));
  conv_norm_out = register_module("conv_norm_out", nn::MakeGroupNorm(groups, widths.back(), kEps));
  conv_out = register_module("conv_out", nn::MakeConv2d(widths.back(), 2 * c.latent_channels, 3));
}

at::Tensor VaeEncoderImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = nn::RunConv2d(ops, conv_in, x);
  for (const auto& block : *down_blocks) h = block->as<DownEncoderBlock2DImpl>()->forward(h, ops);
  h = mid_block->forward(h, ops);
  h = at::silu(nn::RunGroupNorm(ops, conv_norm_out, h));
  return nn::RunConv2d(ops, conv_out, h);
}

AutoencoderKLEncodeModuleImpl::AutoencoderKLEncodeModuleImpl(const AutoencoderKLConfig& c) {
  encoder = register_module("encoder", VaeEncoder(c));
  if (c.use_quant_conv) {
    quant_conv = register_module("quant_conv", nn::MakeConv2d(2 * c.latent_channels, 2 * c.latent_channels, 1));
  }
}

at::Tensor AutoencoderKLEncodeModuleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = encoder->forward(x, ops);
  return quant_conv ? nn::RunConv2d(ops, quant_conv, h) : h;
}

absl::Status AutoencoderKLShapedEncoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const int64_t least = int64_t{1} << downsamplers_;
  if (image.size(2) < least || image.size(3) < least) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", image.size(2), "x", image.size(3), " pixels is smaller than ", info().diffusers_class,
        " encodes: at least ", least, "x", least, " (its encoder halves the image ", downsamplers_, " times)"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> AutoencoderKLShapedEncoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  out[2] = DownsampledRowLevels(image_shape[2], downsamplers_).back().rows;
  out[3] = DownsampledRowLevels(image_shape[3], downsamplers_).back().rows;
  return out;
}

std::vector<RowLevel> AutoencoderKLShapedEncoder::RowLevels(int64_t input_rows) const {
  return DownsampledRowLevels(input_rows, downsamplers_);
}

AutoencoderKLEncoder::AutoencoderKLEncoder(AutoencoderKLConfig config)
    : AutoencoderKLShapedEncoder({}, static_cast<int64_t>(config.block_out_channels.size()) - 1),
      config_(std::move(config)),
      module_(config_) {
  info_.family = "autoencoder_kl";
  info_.diffusers_class = "AutoencoderKL";
  info_.in_channels = config_.in_channels;
  info_.latent_channels = config_.latent_channels;
  info_.spatial_factor = config_.spatial_factor();
  info_.vae_to_raw_formula = config_.latents_mean   ? "(z - latents_mean) * scaling_factor / latents_std"
                             : config_.shift_factor ? "(z - shift_factor) * scaling_factor"
                                                    : "z * scaling_factor";
  AdoptModule(*module_);
}

at::Tensor AutoencoderKLEncoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->forward(image.to(dtype()), ops);
}

at::Tensor AutoencoderKLEncoder::ToRawSpace(const at::Tensor& z) const {
  // As diffusers' img2img pipelines do it (SDXL with statistics; SD/FLUX/SD3 without).
  if (config_.latents_mean) {
    const auto opts = at::TensorOptions().dtype(z.scalar_type()).device(z.device());
    const int64_t c = config_.latent_channels;
    at::Tensor mean = at::tensor(*config_.latents_mean, at::kDouble).to(opts).view({1, c, 1, 1});
    at::Tensor std = at::tensor(*config_.latents_std, at::kDouble).to(opts).view({1, c, 1, 1});
    return (z - mean) * config_.scaling_factor / std;
  }
  if (config_.shift_factor) return (z - *config_.shift_factor) * config_.scaling_factor;
  return z * config_.scaling_factor;
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadAutoencoderKLEncoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<AutoencoderKLEncoder>(files, options, {{"decoder.", "post_quant_conv."}, {}});
}

}  // namespace vaedecode::families::autoencoder_kl
