#include "families/hunyuanimage3/decoder.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/hunyuanimage3/encoder.h"

namespace vaedecode::families::hunyuanimage3 {
namespace {

ModelInfo Describe(const HunyuanImage3Config& c, std::string config_json) {
  ModelInfo info;
  info.family = "hunyuanimage3";
  info.diffusers_class = "AutoencoderKLConv3D";
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.config_warnings = c.structure_warnings;
  info.latent_channels = c.latent_channels;
  info.out_channels = c.out_channels;
  info.spatial_factor = c.spatial_factor();
  info.scaling_factor = c.scaling_factor;
  info.shift_factor = c.shift_factor;
  info.raw_to_vae_formula = c.shift_factor ? "z / scaling_factor + shift_factor" : "z / scaling_factor";
  // The release's spatial tiles: sample_size pixels, overlap 0.25.
  info.stock_tile = std::max<int64_t>(1, c.sample_size / c.ffactor_spatial);
  info.stock_stride = std::max<int64_t>(1, info.stock_tile * 3 / 4);
  info.decode_note = absl::StrCat(
      "latents are the pipeline's [B, C, h, w] (vae.decode's [B, C, 1, h, w] without its frame axis); the decoder "
      "makes ",
      c.decoded_frames(), " frames of the one latent frame and, as the release's decode does, the image is the last");
  return info;
}

}  // namespace

HunyuanImage3ModuleImpl::HunyuanImage3ModuleImpl(const HunyuanImage3Config& c) {
  decoder = register_module("decoder", Decoder3D(c));
}

HunyuanImage3Decoder::HunyuanImage3Decoder(HunyuanImage3Config config, std::string config_json)
    : ModuleDecoder(HunyuanImage3Module(config), Describe(config, std::move(config_json)), /*latent_halo_rows=*/1),
      config_(std::move(config)) {}

at::Tensor HunyuanImage3Decoder::ToVaeSpace(const at::Tensor& raw) const {
  const at::Tensor z = raw / config_.scaling_factor;
  return config_.shift_factor ? z + *config_.shift_factor : z;
}

at::Tensor HunyuanImage3Decoder::Decode(const at::Tensor& z, LayerOps& ops) {
  at::NoGradGuard no_grad;
  const at::Tensor frames = module_->decoder->forward(z.to(dtype()).unsqueeze(2), ops);  // [B, out, F, H, W]
  return frames.select(2, frames.size(2) - 1).contiguous();
}

void Register(Registry& registry) {
  // 5-D convs under `decoder.mid.block_1` / `decoder.up.<i>.block.<j>`
  // (the original VAE's names), with a 1x1x1 `proj_out` in the attention.
  registry.Register(
      {"hunyuanimage3",
       {"AutoencoderKLConv3D"},
       [](const ModelFiles& files, const LoadOptions& options) {
         return LoadModuleDecoder<HunyuanImage3Decoder>(files, options, {{"encoder."}, {}});
       },
       {{{"AutoencoderKLConv3D"},
         {{"decoder.conv_in.weight", 5}, {"decoder.norm_out.weight", 1}, {"decoder.mid.attn_1.proj_out.weight", 5}},
         {}}},
       &LoadHunyuanImage3Encoder});
}

}  // namespace vaedecode::families::hunyuanimage3
