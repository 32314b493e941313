#include "families/ltx2/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2 {
namespace {

bool Halves(const DownBlockSpec& b, int axis) { return !b.downsample_type.empty() && b.stride[axis] == 2; }

int64_t EncoderFactor(const LTX2Config& c, int axis) {
  int64_t f = axis == 0 ? c.patch_size_t : c.patch_size;
  for (const DownBlockSpec& b : c.DownBlocks()) {
    if (Halves(b, axis)) f *= 2;
  }
  return f;
}

EncoderInfo Describe(const LTX2Config& c) {
  EncoderInfo info;
  info.family = "ltx2";
  info.diffusers_class = "AutoencoderKLLTX2Video";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = EncoderFactor(c, 1);
  info.temporal_factor = EncoderFactor(c, 0);
  info.is_video = true;
  info.floors_sizes = false;
  info.vae_to_raw_formula = "(z - latents_mean) / latents_std per channel (latents_mean/std: weights buffers)";
  return info;
}

}  // namespace

LTX2EncodeModuleImpl::LTX2EncodeModuleImpl(const LTX2Config& c) {
  encoder = register_module("encoder", LTX2VideoEncoder3d(c));
  latents_mean = register_buffer("latents_mean", at::zeros({c.latent_channels}));
  latents_std = register_buffer("latents_std", at::ones({c.latent_channels}));
}

LTX2Encoder::LTX2Encoder(LTX2Config config)
    : ModuleBackedEncoder(Describe(EncodableConfig(config))), config_(std::move(config)), module_(config_) {
  AdoptModule(*module_);
}

std::vector<int64_t> LTX2Encoder::RowsPerLevel(int64_t pixels) const {
  std::vector<int64_t> rows = {pixels};
  if (config_.patch_size > 1) rows.push_back(pixels / config_.patch_size);
  for (const DownBlockSpec& b : config_.DownBlocks()) {
    if (!Halves(b, 1)) continue;
    // A folding downsampler halves exactly; the stride-2 "conv" (padding 1) rounds up.
    rows.push_back(b.downsample_type == "conv" ? (rows.back() + 1) / 2 : rows.back() / 2);
  }
  return rows;
}

absl::Status LTX2Encoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const EncoderInfo& m = info();
  // Walk the frames through the temporal downsamplers as diffusers does: a
  // folding one repeats the first frame and pairs the rest (an odd count),
  // a "conv" one strides over the causal padding (any count, rounding up).
  int64_t frames = image.size(2);
  for (const DownBlockSpec& b : config_.DownBlocks()) {
    if (!Halves(b, 0)) continue;
    if (b.downsample_type != "conv" && frames % 2 == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a clip of ", image.size(2), " frames cannot be encoded by ", m.diffusers_class, ": it takes 1 + ",
          m.temporal_factor, "·k frames (its downsamplers pack the frames after the first in pairs)"));
    }
    frames = (frames + 1) / 2;
  }
  // Folding downsamplers and the patchify need whole cells at every level.
  for (int64_t side : {image.size(3), image.size(4)}) {
    int64_t rows = side;
    bool whole = side % config_.patch_size == 0;
    rows /= config_.patch_size;
    for (const DownBlockSpec& b : config_.DownBlocks()) {
      if (!Halves(b, 1)) continue;
      if (b.downsample_type != "conv") whole = whole && rows % 2 == 0;
      rows = b.downsample_type == "conv" ? (rows + 1) / 2 : rows / 2;
    }
    if (!whole) {
      return absl::InvalidArgumentError(
          absl::StrCat("frames of ", image.size(3), "x", image.size(4), " pixels cannot be encoded by ",
                       m.diffusers_class, ": both sides must be multiples of ", m.spatial_factor,
                       " (its patchify and downsamplers fold whole cells of pixels into channels)"));
    }
    if (config_.encoder_spatial_padding == PaddingMode::kReflect && rows < 2) {
      return absl::InvalidArgumentError(absl::StrCat("frames of ", image.size(3), "x", image.size(4),
                                                     " pixels are too small for ", m.diffusers_class,
                                                     "'s reflect padding: the latent needs 2 rows and columns"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> LTX2Encoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  int64_t frames = image_shape[2];
  for (const DownBlockSpec& b : config_.DownBlocks()) {
    if (Halves(b, 0)) frames = (frames + 1) / 2;
  }
  out[2] = frames;
  out[3] = RowsPerLevel(image_shape[3]).back();
  out[4] = RowsPerLevel(image_shape[4]).back();
  return out;
}

std::vector<RowLevel> LTX2Encoder::RowLevels(int64_t input_rows) const {
  // The input covers patch_size times the patchified level's rows, each
  // level after it twice the next one's.
  const std::vector<int64_t> rows = RowsPerLevel(input_rows);
  std::vector<int64_t> ratios(rows.size() - 1, 2);
  if (config_.patch_size > 1) ratios[0] = config_.patch_size;
  return RowLevelsOfRows(rows, ratios);
}

at::Tensor LTX2Encoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->encoder->forward(image.to(dtype()), ops);
}

at::Tensor LTX2Encoder::ToRawSpace(const at::Tensor& z) const {
  const int64_t c = config_.latent_channels;
  const auto type = z.scalar_type();
  const at::Tensor mean = module_->latents_mean.view({1, c, 1, 1, 1}).to(type);
  const at::Tensor std = module_->latents_std.view({1, c, 1, 1, 1}).to(type);
  return (z - mean) / std;  // the pipeline's scaling_factor argument is its default, 1.0
}

void LTX2Encoder::ConvertWeights(at::ScalarType dtype) { module_->encoder->to(dtype); }

absl::StatusOr<std::unique_ptr<Encoder>> LoadLTX2Encoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<LTX2Encoder>(files, options, {{"decoder."}, {}});
}

}  // namespace vaedecode::families::ltx2
