#include "families/hunyuanvideo15/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanvideo15 {
namespace {

EncoderInfo Describe(const HunyuanVideo15Config& c) {
  EncoderInfo info;
  info.family = "hunyuanvideo15";
  info.diffusers_class = "AutoencoderKLHunyuanVideo15";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = c.encoder_spatial_factor();
  info.temporal_factor = c.encoder_temporal_factor();
  info.is_video = true;
  info.floors_sizes = false;
  info.vae_to_raw_formula = "z * scaling_factor";
  return info;
}

int64_t Log2(int64_t power_of_two) {
  int64_t n = 0;
  while ((int64_t{1} << n) < power_of_two) ++n;
  return n;
}

}  // namespace

HunyuanVideo15EncodeModuleImpl::HunyuanVideo15EncodeModuleImpl(const HunyuanVideo15Config& c) {
  encoder = register_module("encoder", Encoder3D(c));
}

HunyuanVideo15Encoder::HunyuanVideo15Encoder(HunyuanVideo15Config config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

absl::Status HunyuanVideo15Encoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const EncoderInfo& m = info();
  const int64_t frames = image.size(2);
  if ((frames - 1) % m.temporal_factor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a clip of ", frames, " frames cannot be encoded by ", m.diffusers_class, ": it takes 1 + ",
                     m.temporal_factor, "·k frames (its downsamplers pack the frames after the first in ", "pairs)"));
  }
  if (image.size(3) % m.spatial_factor != 0 || image.size(4) % m.spatial_factor != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frames of ", image.size(3), "x", image.size(4), " pixels cannot be encoded by ", m.diffusers_class,
        ": both sides must be multiples of ", m.spatial_factor, " (its downsamplers fold 2x2 pixels into channels)"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> HunyuanVideo15Encoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  out[2] = 1 + (image_shape[2] - 1) / info().temporal_factor;
  out[3] = image_shape[3] / info().spatial_factor;
  out[4] = image_shape[4] / info().spatial_factor;
  return out;
}

std::vector<RowLevel> HunyuanVideo15Encoder::RowLevels(int64_t input_rows) const {
  return HalvedRowLevels(input_rows, Log2(info().spatial_factor));  // the sides are multiples of the factor
}

at::Tensor HunyuanVideo15Encoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->encoder->forward(image.to(dtype()), ops);
}

at::Tensor HunyuanVideo15Encoder::ToRawSpace(const at::Tensor& z) const { return z * config_.scaling_factor; }

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanVideo15Encoder(const ModelFiles& files,
                                                                   const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<HunyuanVideo15Encoder>(files, options, {{"decoder."}, {}});
}

}  // namespace vaedecode::families::hunyuanvideo15
