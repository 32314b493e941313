#include "families/hunyuanvideo15/decoder.h"

#include "families/hunyuanvideo15/encoder.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace vaedecode::families::hunyuanvideo15 {
namespace {

ModelInfo Describe(const HunyuanVideo15Config& c, std::string config_json) {
  ModelInfo info;
  info.family = "hunyuanvideo15";
  info.diffusers_class = "AutoencoderKLHunyuanVideo15";
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.latent_channels = c.latent_channels;
  info.out_channels = c.out_channels;
  info.spatial_factor = c.spatial_factor();
  info.temporal_factor = c.temporal_factor();
  info.is_video = true;
  // The whole clip at once over row bands (dense decodes go a latent frame
  // at a time, but the memory model is one for both: it errs safe there).
  info.peak_latent_frames = 0;
  info.cancel_with_halo = true;  // one attention (mid block), no GroupNorm
  info.scaling_factor = c.scaling_factor;
  info.raw_to_vae_formula = "z / scaling_factor";
  // AutoencoderKLHunyuanVideo15.tiled_decode: 256-pixel tiles, overlap 0.25.
  info.stock_tile = std::max<int64_t>(1, HunyuanVideo15Config::kTileSampleMinSize / info.spatial_factor);
  info.stock_stride = std::max<int64_t>(1, info.stock_tile * 3 / 4);
  return info;
}

}  // namespace

HunyuanVideo15ModuleImpl::HunyuanVideo15ModuleImpl(const HunyuanVideo15Config& c) {
  decoder = register_module("decoder", Decoder3D(c));
}

HunyuanVideo15Decoder::HunyuanVideo15Decoder(HunyuanVideo15Config config, std::string config_json)
    : ModuleDecoder(HunyuanVideo15Module(config), Describe(config, std::move(config_json)), /*latent_halo_rows=*/1),
      config_(std::move(config)) {}

at::Tensor HunyuanVideo15Decoder::ToVaeSpace(const at::Tensor& raw) const { return raw / config_.scaling_factor; }

at::Tensor HunyuanVideo15Decoder::Decode(const at::Tensor& z, LayerOps& ops) {
  return OpenStream()->DecodeChunk(z, ops, /*clip_ends=*/true);
}

std::unique_ptr<DecodeStream> HunyuanVideo15Decoder::OpenStream(const DecodeConditioning&) {
  return std::make_unique<StatefulDecodeStream<StreamState>>(
      [&decoder = *module_->decoder, dtype = dtype()](const at::Tensor& z, LayerOps& ops, StreamState& state,
                                                      bool clip_ends) {
        state.frames.set_clip_ends(clip_ends);
        return decoder.forward(z.to(dtype), ops, &state);
      });
}

void Register(Registry& registry) {
  // Causal-conv wrappers (".conv.") like HunyuanVideo, but RMS norms with
  // `gamma` and "norm_out" where HunyuanVideo has GroupNorm "conv_norm_out".
  registry.Register(
      {"hunyuanvideo15",
       {"AutoencoderKLHunyuanVideo15"},
       [](const ModelFiles& files, const LoadOptions& options) {
         return LoadModuleDecoder<HunyuanVideo15Decoder>(files, options, {{"encoder."}, {}});
       },
       {{{"AutoencoderKLHunyuanVideo15"}, {{"decoder.conv_in.conv.weight", 5}, {"decoder.norm_out.gamma", 4}}, {}}},
       &LoadHunyuanVideo15Encoder});
}

}  // namespace vaedecode::families::hunyuanvideo15
