#include "families/minimax_h3/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::minimax_h3 {
namespace {

// A level's downsampler, when its factors are not both 1.
bool HasDownsampler(const MiniMaxH3Config& c, size_t level) {
  return c.temporal_downsample_factors[level] * c.spatial_downsample_factors[level] > 1;
}

EncoderInfo Describe(const MiniMaxH3Config& c) {
  EncoderInfo info;
  info.family = "minimax_h3";
  info.diffusers_class = "AutoencoderKLMiniMaxH3";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = c.patch_size();
  info.temporal_factor = c.patch_size_t();
  info.is_video = true;
  info.clip_frames = c.clip_length;
  info.floors_sizes = false;
  info.computes_in_float32 = true;
  info.pixels = PipelinePixels(c.in_channels);
  info.vae_to_raw_formula = "(z.to(float16) - latents_mean) / latents_std per channel (latents_mean/std: config)";
  return info;
}

}  // namespace

MiniMaxH3EncodeModuleImpl::MiniMaxH3EncodeModuleImpl(const MiniMaxH3Config& c) {
  encoder = register_module("encoder", VideoEncoder(c));
  const int64_t moments = 2 * c.latent_channels;
  quant_conv = register_module("quant_conv", torch::nn::Conv3d(torch::nn::Conv3dOptions(moments, moments, 1)));
}

at::Tensor MiniMaxH3EncodeModuleImpl::EncodeClip(const at::Tensor& x, LayerOps& ops) {
  return ops.Conv(encoder->forward(x, ops), quant_conv->weight, quant_conv->bias, ConvGeometry{});
}

MiniMaxH3Encoder::MiniMaxH3Encoder(MiniMaxH3Config config)
    : ModuleBackedEncoder(Describe(EncodableConfig(config))), config_(std::move(config)), module_(config_) {
  AdoptModule(*module_);
}

std::vector<int64_t> MiniMaxH3Encoder::RowsPerLevel(int64_t pixels) const {
  std::vector<int64_t> rows = {pixels};
  for (size_t i = 0; i < config_.block_out_channels.size(); ++i) {
    const int64_t s = config_.spatial_downsample_factors[i];
    if (!HasDownsampler(config_, i)) continue;
    // Stride 2 after a bottom pad of 1: floor(rows / 2). Other strides pad nothing,
    // so the 3-row kernel shrinks the rows (stride 1: by 2).
    // (0 when the kernel no longer fits: diffusers' conv fails there.)
    const int64_t span = s == 2 ? rows.back() + 1 : rows.back();
    rows.push_back(span >= 3 ? (span - 3) / s + 1 : 0);
  }
  return rows;
}

int64_t MiniMaxH3Encoder::ClipLatentFrames(int64_t frames) const {
  for (size_t i = 0; i < config_.block_out_channels.size(); ++i) {
    // 2 causal zero frames, a 3-frame kernel, stride t.
    if (HasDownsampler(config_, i)) frames = (frames - 1) / config_.temporal_downsample_factors[i] + 1;
  }
  return frames;
}

absl::Status MiniMaxH3Encoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const EncoderInfo& m = info();
  const std::vector<int64_t> latent = LatentShape(image.sizes().vec());
  // The padding modes but zeros need 2 rows and columns at every level, and
  // the levels shrink: the latent's are the fewest.
  const int64_t least = config_.encoder_padding == PaddingMode::kZeros ? 1 : 2;
  if (latent[3] < least || latent[4] < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("frames of ", image.size(3), "x", image.size(4), " pixels are too small for ", m.diffusers_class,
                     ": its ", config_.spatial_padding_mode, " padding needs latents of at least ", least, "x", least));
  }
  if (latent[2] < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a clip of ", image.size(2), " frames leaves no latent frame after ",
                                                   m.diffusers_class, " drops its last ", config_.token_drop));
  }
  return absl::OkStatus();
}

std::vector<int64_t> MiniMaxH3Encoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  const int64_t frames = image_shape[2];
  if (frames == 1) {
    out[2] = ClipLatentFrames(1);
  } else {
    const int64_t clips = (frames + config_.clip_length - 1) / config_.clip_length;
    out[2] = clips * ClipLatentFrames(config_.clip_length) - config_.token_drop;
  }
  out[3] = RowsPerLevel(image_shape[3]).back();
  out[4] = RowsPerLevel(image_shape[4]).back();
  return out;
}

std::vector<RowLevel> MiniMaxH3Encoder::RowLevels(int64_t input_rows) const {
  // Each level covers twice the next one's rows per latent row.
  const std::vector<int64_t> rows = RowsPerLevel(input_rows);
  return RowLevelsOfRows(rows, std::vector<int64_t>(rows.size() - 1, 2));
}

absl::Status MiniMaxH3Encoder::CheckExactSharding(const std::vector<int64_t>& image_shape, int world_size) const {
  for (size_t i = 0; i < config_.block_out_channels.size(); ++i) {
    const int64_t s = config_.spatial_downsample_factors[i];
    if (HasDownsampler(config_, i) && s != 2) {
      return absl::FailedPreconditionError(
          absl::StrCat("level ", i, "'s downsampler strides rows by ", s,
                       " without padding, so its rows do not map to whole latent rows: encoded dense"));
    }
  }
  return Encoder::CheckExactSharding(image_shape, world_size);
}

at::Tensor MiniMaxH3Encoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  const at::Tensor x = image.to(dtype());
  const int64_t frames = x.size(2), clip = config_.clip_length;
  if (frames == 1) return module_->EncodeClip(x, ops);  // a single frame: no temporal chunking
  at::Tensor padded = x;
  if (frames % clip != 0) {
    const int64_t pad = clip - frames % clip;
    padded = at::cat({x, x.narrow(2, frames - 1, 1).expand({-1, -1, pad, -1, -1})}, 2);
  }
  std::vector<at::Tensor> moments;
  for (int64_t start = 0; start < padded.size(2); start += clip) {
    moments.push_back(module_->EncodeClip(padded.narrow(2, start, clip), ops));
  }
  at::Tensor all = at::cat(moments, 2);
  return all.narrow(2, 0, all.size(2) - config_.token_drop);
}

at::Tensor MiniMaxH3Encoder::ToRawSpace(const at::Tensor& z) const {
  // encode_vae_condition: latents.to(float16).float(), then float32 statistics.
  const int64_t c = config_.latent_channels;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(z.device());
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
  const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
  return ((z.to(at::kHalf).to(at::kFloat) - mean) / std).to(z.scalar_type());
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadMiniMaxH3Encoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<MiniMaxH3Encoder>(files, options, {{"decoder.", "post_quant_conv."}, {}});
}

}  // namespace vaedecode::families::minimax_h3
