#include "families/hunyuanimage/decoder.h"

#include "families/hunyuanimage/encoder.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace vaedecode::families::hunyuanimage {
namespace {

ModelInfo Describe(const HunyuanImageConfig& c, std::string config_json) {
  ModelInfo info;
  info.family = "hunyuanimage";
  info.diffusers_class = "AutoencoderKLHunyuanImage";
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.config_warnings = c.structure_warnings;
  info.latent_channels = c.latent_channels;
  info.out_channels = c.out_channels;
  info.spatial_factor = c.spatial_factor();
  info.scaling_factor = c.scaling_factor;
  info.raw_to_vae_formula = "z / scaling_factor";
  // AutoencoderKLHunyuanImage.tiled_decode: sample_size-pixel tiles, overlap 0.25.
  info.stock_tile = std::max<int64_t>(1, c.sample_size / c.spatial_compression_ratio);
  info.stock_stride = std::max<int64_t>(1, info.stock_tile * 3 / 4);
  return info;
}

}  // namespace

HunyuanImageModuleImpl::HunyuanImageModuleImpl(const HunyuanImageConfig& c) {
  decoder = register_module("decoder", Decoder2D(c));
}

HunyuanImageDecoder::HunyuanImageDecoder(HunyuanImageConfig config, std::string config_json)
    : ModuleDecoder(HunyuanImageModule(config), Describe(config, std::move(config_json)), /*latent_halo_rows=*/1),
      config_(std::move(config)) {}

at::Tensor HunyuanImageDecoder::ToVaeSpace(const at::Tensor& raw) const { return raw / config_.scaling_factor; }

at::Tensor HunyuanImageDecoder::Decode(const at::Tensor& z, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->decoder->forward(z.to(dtype()), ops);
}

void Register(Registry& registry) {
  // Every 3x3 conv is a plain Conv2d, the attention's q/k/v are 1x1 convs
  // ("norm", "proj"), and the output norm is "norm_out", not "conv_norm_out".
  registry.Register({"hunyuanimage",
                     {"AutoencoderKLHunyuanImage"},
                     [](const ModelFiles& files, const LoadOptions& options) {
                       return LoadModuleDecoder<HunyuanImageDecoder>(files, options, {{"encoder."}, {}});
                     },
                     {{{"AutoencoderKLHunyuanImage"},
                       {{"decoder.conv_in.weight", 4},
                        {"decoder.norm_out.weight", 1},
                        {"decoder.mid_block.attentions.0.proj.weight", 4}},
                       {}}},
                     &LoadHunyuanImageEncoder});
}

}  // namespace vaedecode::families::hunyuanimage
