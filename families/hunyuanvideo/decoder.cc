#include "families/hunyuanvideo/decoder.h"

#include "families/hunyuanvideo/encoder.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/weight_loading.h"

namespace vaedecode::families::hunyuanvideo {

AutoencoderKLHunyuanVideoModuleImpl::AutoencoderKLHunyuanVideoModuleImpl(const HunyuanVideoConfig& c) : config_(c) {
  decoder = register_module("decoder", HunyuanVideoDecoder3D(c));
  post_quant_conv = register_module(
      "post_quant_conv", torch::nn::Conv3d(torch::nn::Conv3dOptions(c.latent_channels, c.latent_channels, 1)));
}

at::Tensor AutoencoderKLHunyuanVideoModuleImpl::DecodeWhole(const at::Tensor& z, LayerOps& ops) {
  return decoder->forward(ops.Conv(z, post_quant_conv->weight, post_quant_conv->bias, ConvGeometry{}), ops);
}

at::Tensor AutoencoderKLHunyuanVideoModuleImpl::Decode(const at::Tensor& z, LayerOps& ops) {
  const int64_t frames = z.size(2);
  const int64_t min_frames = config_.tile_latent_min_frames();
  if (frames <= min_frames) return DecodeWhole(z, ops);

  // _temporal_tiled_decode: windows of min_frames + 1 latent frames every
  // `stride`; later windows drop their first decoded frame; each window's
  // first `blend` frames are blended in place with the previous window's
  // last ones (in order, so a short window blends its already blended frames
  // into the next), then cut to the stride.
  const int64_t stride = config_.tile_latent_stride_frames();
  const int64_t sample_stride = HunyuanVideoConfig::kTileSampleStrideNumFrames;
  const int64_t sample_frames = (frames - 1) * config_.temporal_compression_ratio + 1;
  std::vector<at::Tensor> row;
  for (int64_t i = 0; i < frames; i += stride) {
    at::Tensor decoded = DecodeWhole(z.narrow(2, i, std::min(min_frames + 1, frames - i)), ops);
    if (i > 0) decoded = decoded.narrow(2, 1, decoded.size(2) - 1);
    row.push_back(decoded);
  }
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < row.size(); ++i) {
    at::Tensor& tile = row[i];
    if (i == 0) {
      result.push_back(tile.narrow(2, 0, std::min(sample_stride + 1, tile.size(2))));
      continue;
    }
    BlendFramesIntoNext(row[i - 1], tile, config_.blend_frames());
    result.push_back(tile.narrow(2, 0, std::min(sample_stride, tile.size(2))));
  }
  at::Tensor out = at::cat(result, 2);
  return out.narrow(2, 0, std::min(sample_frames, out.size(2)));
}

HunyuanVideoDecoder::HunyuanVideoDecoder(HunyuanVideoConfig config, std::string config_json)
    : ModuleDecoder(AutoencoderKLHunyuanVideoModule(config), {}, /*latent_halo_rows=*/1), config_(std::move(config)) {
  info_.family = "hunyuanvideo";
  info_.diffusers_class = "AutoencoderKLHunyuanVideo";
  info_.config_json = std::move(config_json);
  info_.unread_config_keys = config_.unread_keys;
  info_.latent_channels = config_.latent_channels;
  info_.out_channels = config_.out_channels;
  info_.spatial_factor = config_.spatial_factor();
  info_.temporal_factor = config_.temporal_factor();
  info_.is_video = true;
  // Longer clips decode in temporal windows of min_frames + 1 latent frames.
  info_.peak_latent_frames = config_.tile_latent_min_frames() + 1;
  info_.scaling_factor = config_.scaling_factor;
  info_.raw_to_vae_formula = "z / scaling_factor";
  // AutoencoderKLHunyuanVideo.tiled_decode: 256-pixel tiles every 192 pixels.
  info_.stock_tile = std::max<int64_t>(1, 256 / info_.spatial_factor);
  info_.stock_stride = std::max<int64_t>(1, 192 / info_.spatial_factor);
}

at::Tensor HunyuanVideoDecoder::ToVaeSpace(const at::Tensor& raw) const { return raw / config_.scaling_factor; }

absl::Status HunyuanVideoDecoder::CheckStreaming() const {
  return absl::FailedPreconditionError(
      "AutoencoderKLHunyuanVideo cannot be decoded chunk by chunk: its GroupNorms take their statistics over every "
      "frame of the clip, so each frame depends on the frames after it and no chunked decode equals the whole "
      "decode");
}

at::Tensor HunyuanVideoDecoder::Decode(const at::Tensor& z, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->Decode(z.to(dtype()), ops);
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadHunyuanVideo(const ModelFiles& files, const LoadOptions& options) {
  // decode() never touches the encoder side; those keys are ignored by name.
  return LoadModuleDecoder<HunyuanVideoDecoder>(files, options, {{"encoder.", "quant_conv."}, {}});
}

void Register(Registry& registry) {
  // Causal-conv wrappers with GroupNorm and a mid-block attention.
  registry.Register(
      {"hunyuanvideo",
       {"AutoencoderKLHunyuanVideo"},
       &LoadHunyuanVideo,
       {{{"AutoencoderKLHunyuanVideo"}, {{"decoder.conv_in.conv.weight", 5}, {"decoder.conv_norm_out.weight", 1}}, {}}},
       &LoadHunyuanVideoEncoder});
}

}  // namespace vaedecode::families::hunyuanvideo
