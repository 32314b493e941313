#include "families/hunyuanvideo/encoder.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "families/module_encoder.h"

namespace vaedecode::families::hunyuanvideo {
namespace {

EncoderInfo Describe(const HunyuanVideoConfig& c) {
  EncoderInfo info;
  info.family = "hunyuanvideo";
  info.diffusers_class = "AutoencoderKLHunyuanVideo";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = int64_t{1} << c.encoder_spatial_downsamplers();
  info.temporal_factor = c.temporal_compression_ratio;
  info.is_video = true;
  info.floors_sizes = true;  // rounds up, in fact: any size encodes
  info.vae_to_raw_formula = "z * scaling_factor";
  return info;
}

// Frames out of the encoder for `frames` in: each temporal downsampler
// (causal padding 2, kernel 3, stride 2) makes ceil(frames / 2).
int64_t EncodedFrames(const HunyuanVideoConfig& c, int64_t frames) {
  for (const DownBlockSpec& b : c.DownBlocks()) {
    if (b.downsample_time) frames = (frames + 1) / 2;
  }
  return frames;
}

}  // namespace

HunyuanVideoEncodeModuleImpl::HunyuanVideoEncodeModuleImpl(const HunyuanVideoConfig& c) : config_(c) {
  encoder = register_module("encoder", HunyuanVideoEncoder3D(c));
  quant_conv = register_module("quant_conv", torch::nn::Conv3d(torch::nn::Conv3dOptions(
                                                 2 * c.latent_channels, 2 * c.latent_channels, {1, 1, 1})));
}

at::Tensor HunyuanVideoEncodeModuleImpl::EncodeWhole(const at::Tensor& x, LayerOps& ops) {
  return ops.Conv(encoder->forward(x, ops), quant_conv->weight, quant_conv->bias, ConvGeometry{});
}

at::Tensor HunyuanVideoEncodeModuleImpl::Encode(const at::Tensor& x, LayerOps& ops) {
  const int64_t frames = x.size(2);
  const int64_t min_frames = HunyuanVideoConfig::kTileSampleMinNumFrames;
  if (frames <= min_frames) return EncodeWhole(x, ops);
  // _temporal_tiled_encode (see encoder.h).
  const int64_t stride = HunyuanVideoConfig::kTileSampleStrideNumFrames;
  const int64_t latent_frames = (frames - 1) / config_.temporal_compression_ratio + 1;
  const int64_t latent_stride = stride / config_.temporal_compression_ratio;
  const int64_t blend = min_frames / config_.temporal_compression_ratio - latent_stride;
  std::vector<at::Tensor> row;
  for (int64_t i = 0; i < frames; i += stride) {
    const int64_t length = std::min(min_frames + 1, frames - i);
    // A window whose only latent frame is dropped adds nothing: not encoded.
    if (i > 0 && EncodedFrames(config_, length) <= 1) continue;
    at::Tensor tile = EncodeWhole(x.narrow(2, i, length), ops);
    if (i > 0) tile = tile.narrow(2, 1, tile.size(2) - 1);
    row.push_back(tile);
  }
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < row.size(); ++i) {
    at::Tensor& tile = row[i];
    if (i == 0) {
      result.push_back(tile.narrow(2, 0, std::min(latent_stride + 1, tile.size(2))));
      continue;
    }
    BlendFramesIntoNext(row[i - 1], tile, blend);
    result.push_back(tile.narrow(2, 0, std::min(latent_stride, tile.size(2))));
  }
  const at::Tensor out = at::cat(result, 2);
  return out.narrow(2, 0, std::min(latent_frames, out.size(2)));
}

HunyuanVideoEncoder::HunyuanVideoEncoder(HunyuanVideoConfig config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

std::vector<int64_t> HunyuanVideoEncoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  const int64_t frames = image_shape[2];
  out[2] = frames <= HunyuanVideoConfig::kTileSampleMinNumFrames
               ? EncodedFrames(config_, frames)
               : (frames - 1) / config_.temporal_compression_ratio + 1;
  const std::vector<RowLevel> rows = RowLevels(image_shape[3]);
  const std::vector<RowLevel> cols = RowLevels(image_shape[4]);
  out[3] = rows.back().rows;
  out[4] = cols.back().rows;
  return out;
}

std::vector<RowLevel> HunyuanVideoEncoder::RowLevels(int64_t input_rows) const {
  // Each spatial downsampler makes ceil(rows / 2).
  const int64_t n = config_.encoder_spatial_downsamplers();
  std::vector<RowLevel> levels;
  int64_t rows = input_rows;
  for (int64_t i = 0; i <= n; ++i) {
    levels.push_back({rows, int64_t{1} << (n - i)});
    rows = (rows + 1) / 2;
  }
  return levels;
}

at::Tensor HunyuanVideoEncoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->Encode(image.to(dtype()), ops);
}

at::Tensor HunyuanVideoEncoder::ToRawSpace(const at::Tensor& z) const { return z * config_.scaling_factor; }

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanVideoEncoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<HunyuanVideoEncoder>(files, options, {{"decoder.", "post_quant_conv."}, {}});
}

}  // namespace vaedecode::families::hunyuanvideo
