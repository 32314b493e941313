#include "families/hunyuanimage3/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/module_encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanimage3 {
namespace {

EncoderInfo Describe(const HunyuanImage3Config& c) {
  EncoderInfo info;
  info.family = "hunyuanimage3";
  info.diffusers_class = "AutoencoderKLConv3D";
  info.in_channels = c.in_channels;
  info.latent_channels = c.latent_channels;
  info.spatial_factor = int64_t{1} << c.encoder_downsamplers();
  info.floors_sizes = false;
  info.vae_to_raw_formula = c.shift_factor ? "(z - shift_factor) * scaling_factor" : "z * scaling_factor";
  return info;
}

}  // namespace

HunyuanImage3EncodeModuleImpl::HunyuanImage3EncodeModuleImpl(const HunyuanImage3Config& c) {
  encoder = register_module("encoder", Encoder3D(c));
}

HunyuanImage3Encoder::HunyuanImage3Encoder(HunyuanImage3Config config)
    : ModuleBackedEncoder(Describe(config)), config_(std::move(config)), module_(EncodableConfig(config_)) {
  AdoptModule(*module_);
}

absl::Status HunyuanImage3Encoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const int64_t factor = info().spatial_factor;
  if (image.size(2) % factor != 0 || image.size(3) % factor != 0) {
    return absl::InvalidArgumentError(absl::StrCat("an image of ", image.size(2), "x", image.size(3),
                                                   " pixels cannot be encoded by AutoencoderKLConv3D: both sides "
                                                   "must be multiples of ",
                                                   factor, " (its downsamplers fold 2x2 pixels into channels)"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> HunyuanImage3Encoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  out[2] = image_shape[2] / info().spatial_factor;
  out[3] = image_shape[3] / info().spatial_factor;
  return out;
}

std::vector<RowLevel> HunyuanImage3Encoder::RowLevels(int64_t input_rows) const {
  return HalvedRowLevels(input_rows, config_.encoder_downsamplers());  // the sides are multiples of the factor
}

at::Tensor HunyuanImage3Encoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  // The release's encode: one frame expanded to ffactor_temporal frames.
  const at::Tensor clip = image.to(dtype()).unsqueeze(2).expand(
      {image.size(0), image.size(1), config_.ffactor_temporal, image.size(2), image.size(3)});
  return module_->encoder->forward(clip.contiguous(), ops).squeeze(2);  // [B, 2·Cz, h, w]
}

at::Tensor HunyuanImage3Encoder::ToRawSpace(const at::Tensor& z) const {
  // HunyuanImage3ForCausalMM.vae_encode: latents.sub_(shift_factor) if set, then mul_(scaling_factor).
  const at::Tensor shifted = config_.shift_factor ? z - *config_.shift_factor : z;
  return shifted * config_.scaling_factor;
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanImage3Encoder(const ModelFiles& files, const LoadOptions& options) {
  // encode() never touches the decoder side; those keys are ignored by name.
  return LoadModuleEncoder<HunyuanImage3Encoder>(files, options, {{"decoder."}, {}});
}

}  // namespace vaedecode::families::hunyuanimage3
