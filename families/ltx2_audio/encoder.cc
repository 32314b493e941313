#include "families/ltx2_audio/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/input_checks.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2_audio {
namespace {

constexpr const char* kClass = "AutoencoderKLLTX2Audio";

EncoderInfo Describe(const LTX2AudioConfig& c) {
  EncoderInfo info;
  info.family = "ltx2_audio";
  info.diffusers_class = kClass;
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = int64_t{1} << (c.levels() - 1);
  info.computes_in_float32 = true;
  info.is_audio = true;
  info.vae_to_raw_formula =
      "packed [B, L, C*M] (x.transpose(1, 2).flatten(2, 3)): (x - latents_mean) / latents_std over the C*M features";
  return info;
}

// LTX2AudioDownsample's zero padding before its unpadded 3x3 of stride 2,
// per axis: {before, after} of frames (dim 2) or mel bins (dim 3).
std::pair<int64_t, int64_t> DownsamplePadding(CausalityAxis axis, int dim) {
  switch (axis) {
    case CausalityAxis::kNone:
      return {0, 1};
    case CausalityAxis::kWidth:
      return dim == 2 ? std::pair<int64_t, int64_t>{0, 1} : std::pair<int64_t, int64_t>{2, 0};
    case CausalityAxis::kHeight:
      return dim == 2 ? std::pair<int64_t, int64_t>{2, 0} : std::pair<int64_t, int64_t>{0, 1};
    case CausalityAxis::kWidthCompatibility:
      return dim == 2 ? std::pair<int64_t, int64_t>{0, 1} : std::pair<int64_t, int64_t>{1, 0};
  }
  return {0, 0};
}

}  // namespace

AudioEncodeModuleImpl::AudioEncodeModuleImpl(const LTX2AudioConfig& c) {
  encoder = register_module("encoder", AudioEncoder(c));
  latents_mean = register_buffer("latents_mean", at::zeros({c.base_channels}));
  latents_std = register_buffer("latents_std", at::ones({c.base_channels}));
}

LTX2AudioEncoder::LTX2AudioEncoder(LTX2AudioConfig config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

std::vector<int64_t> LTX2AudioEncoder::Sizes(int64_t input, int dim) const {
  const auto [before, after] = DownsamplePadding(config_.causality_axis, dim);
  std::vector<int64_t> sizes = {input};
  for (int64_t level = 0; level + 1 < config_.levels(); ++level) {
    const int64_t padded = sizes.back() + before + after;
    sizes.push_back(padded < 3 ? 0 : (padded - 3) / 2 + 1);
  }
  return sizes;
}

absl::Status LTX2AudioEncoder::ValidateImage(const at::Tensor& image) const {
  InputRule rule{"mel spectrogram", kClass, "encodes", config_.in_channels};
  rule.is_spectrogram = true;
  RETURN_IF_ERROR(CheckInputTensor(image, rule));
  for (int dim : {2, 3}) {
    if (Sizes(image.size(dim), dim).back() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("a mel spectrogram of ", image.size(dim),
                                                     dim == 2 ? " frames" : " mel bins", " is too short for ", kClass,
                                                     "'s ", config_.levels() - 1, " stride-2 downsamplers"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> LTX2AudioEncoder::LatentShape(const std::vector<int64_t>& shape) const {
  return {shape[0], config_.latent_channels, Sizes(shape[2], 2).back(), Sizes(shape[3], 3).back()};
}

at::Tensor LTX2AudioEncoder::Moments(const at::Tensor& image, LayerOps&) {
  at::NoGradGuard no_grad;
  return module_->encoder->forward(image.to(at::kFloat).contiguous());  // [B, 2·C, L, M]: mean, log-variance
}

absl::Status LTX2AudioEncoder::CheckRawLatentShape(const std::vector<int64_t>& shape) const {
  const int64_t features = shape[1] * shape[3];
  if (features != config_.base_channels) {
    return absl::InvalidArgumentError(absl::StrCat(kClass, "'s latents_mean/latents_std cover ", config_.base_channels,
                                                   " packed features; this latent packs ", shape[1], " x ", shape[3],
                                                   " = ", features));
  }
  return absl::OkStatus();
}

at::Tensor LTX2AudioEncoder::ToRawSpace(const at::Tensor& latent) const {
  // LTX2Pipeline: _pack_audio_latents, then _normalize_audio_latents.
  const at::Tensor packed = latent.transpose(1, 2).flatten(2, 3).to(at::kFloat);
  return ((packed - module_->latents_mean.to(packed.device())) / module_->latents_std.to(packed.device())).contiguous();
}

std::vector<RowLevel> LTX2AudioEncoder::RowLevels(int64_t input_rows) const {
  return RowLevelsOfRows(Sizes(input_rows, 2), std::vector<int64_t>(config_.levels() - 1, 2));
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadLTX2AudioEncoder(const ModelFiles& files, const LoadOptions& options) {
  return LoadModuleEncoder<LTX2AudioEncoder>(files, options, {{"decoder."}, {}});
}

}  // namespace vaedecode::families::ltx2_audio
