#include "families/hunyuanimage/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanimage {
namespace {

EncoderInfo Describe(const HunyuanImageConfig& c) {
  EncoderInfo info;
  info.family = "hunyuanimage";
  info.diffusers_class = "AutoencoderKLHunyuanImage";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = int64_t{1} << c.downsamplers();
  info.floors_sizes = false;
  info.vae_to_raw_formula = "z * scaling_factor";
  return info;
}

}  // namespace

HunyuanImageEncodeModuleImpl::HunyuanImageEncodeModuleImpl(const HunyuanImageConfig& c) {
  encoder = register_module("encoder", Encoder2D(c));
}

HunyuanImageEncoder::HunyuanImageEncoder(HunyuanImageConfig config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

absl::Status HunyuanImageEncoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const int64_t factor = info().spatial_factor;
  if (image.size(2) % factor != 0 || image.size(3) % factor != 0) {
    return absl::InvalidArgumentError(absl::StrCat("an image of ", image.size(2), "x", image.size(3),
                                                   " pixels cannot be encoded by AutoencoderKLHunyuanImage: both "
                                                   "sides must be multiples of ",
                                                   factor, " (its downsamplers fold 2x2 pixels into channels)"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> HunyuanImageEncoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  out[2] = image_shape[2] / info().spatial_factor;
  out[3] = image_shape[3] / info().spatial_factor;
  return out;
}

std::vector<RowLevel> HunyuanImageEncoder::RowLevels(int64_t input_rows) const {
  return HalvedRowLevels(input_rows, config_.downsamplers());  // the sides are multiples of the factor
}

at::Tensor HunyuanImageEncoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->encoder->forward(image.to(dtype()), ops);
}

at::Tensor HunyuanImageEncoder::ToRawSpace(const at::Tensor& z) const { return z * config_.scaling_factor; }

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanImageEncoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<HunyuanImageEncoder>(files, options, {{"decoder."}, {}});
}

}  // namespace vaedecode::families::hunyuanimage
