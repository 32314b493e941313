#include "families/wan/encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/wan/blocks.h"
#include "families/weight_loading.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::wan {
namespace {

// diffusers' _encode: the first frame alone, then chunks of this many.
constexpr int64_t kChunkFrames = 4;

EncoderInfo Describe(const WanFamily& family, const WanConfig& c) {
  EncoderInfo info;
  info.family = family.family;
  info.diffusers_class = family.diffusers_class;
  info.in_channels = c.in_channels / (c.patch() * c.patch());
  info.latent_channels = c.z_dim;
  info.spatial_factor = c.spatial_factor();
  info.temporal_factor = c.image_convs ? 1 : c.temporal_factor();
  info.is_video = true;
  // Wan 2.2's patchify and AvgDown3D shortcuts need whole multiples.
  info.floors_sizes = !c.is_residual && c.patch() == 1;
  info.vae_to_raw_formula =
      family.encode_divides_by_std ? "(z - latents_mean) / latents_std" : "(z - latents_mean) * (1 / latents_std)";
  return info;
}

int64_t Downsamplers(const WanConfig& c) { return c.levels() - 1; }

}  // namespace

absl::StatusOr<std::unique_ptr<WanEncoder>> WanEncoder::Create(const WanFamily& family, WanConfig config) {
  if (!config.attn_scales.empty()) {
    // diffusers' WanEncoder3d passes the feature cache to every down block,
    // which its attention blocks do not take: such a config cannot encode.
    return absl::InvalidArgumentError(absl::StrCat(
        family.diffusers_class, " config has \"attn_scales\"; diffusers cannot encode with encoder attention blocks"));
  }
  if (!config.image_convs && config.temporal_factor() != kChunkFrames) {
    return absl::InvalidArgumentError(absl::StrCat(family.diffusers_class, " config halves time ",
                                                   config.temporal_factor(), "x (\"temperal_downsample\"); ",
                                                   "diffusers' encode feeds chunks of ", kChunkFrames,
                                                   " frames, which only a 4x encoder turns into one latent frame"));
  }
  if (config.in_channels % (config.patch() * config.patch()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(family.diffusers_class, " config: in_channels ", config.in_channels,
                                                   " is not a multiple of patch_size² (", config.patch(), "²)"));
  }
  return std::unique_ptr<WanEncoder>(new WanEncoder(family, std::move(config)));
}

WanEncoder::WanEncoder(const WanFamily& family, WanConfig config)
    : ModuleBackedEncoder(Describe(family, config)),
      config_(std::move(config)),
      divides_by_std_(family.encode_divides_by_std),
      module_(std::make_shared<AutoencoderKLWanEncodeImpl>(config_)) {
  AdoptModule(*module_);
}

WanEncoder::~WanEncoder() = default;

torch::nn::Module& WanEncoder::parameters_module() { return *module_; }

absl::Status WanEncoder::ValidateImage(const at::Tensor& image) const {
  RETURN_IF_ERROR(Encoder::ValidateImage(image));
  const EncoderInfo& m = info();
  const int64_t frames = image.size(2), rows = image.size(3), cols = image.size(4);
  if (config_.image_convs && frames != 1) {
    return absl::InvalidArgumentError(absl::StrCat("a clip of ", frames, " frames cannot be encoded by ",
                                                   m.diffusers_class,
                                                   ": it encodes images (T = 1; its convolutions are 2-D)"));
  }
  if ((frames - 1) % kChunkFrames != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a clip of ", frames, " frames cannot be encoded by ", m.diffusers_class, ": it takes 1 + ", kChunkFrames,
        "·k frames (the first frame alone, then chunks of ", kChunkFrames, "; diffusers drops the rest)"));
  }
  const int64_t least = int64_t{1} << Downsamplers(config_);
  if (!m.floors_sizes && (rows % m.spatial_factor != 0 || cols % m.spatial_factor != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("frames of ", rows, "x", cols, " pixels cannot be encoded by ",
                                                   m.diffusers_class, ": both sides must be multiples of ",
                                                   m.spatial_factor, " (its patchify and AvgDown3D shortcuts)"));
  }
  if (rows < least * config_.patch() || cols < least * config_.patch()) {
    return absl::InvalidArgumentError(absl::StrCat("frames of ", rows, "x", cols, " pixels are smaller than ",
                                                   m.diffusers_class, " encodes: at least ", least, "x", least));
  }
  return absl::OkStatus();
}

std::vector<int64_t> WanEncoder::LatentShape(const std::vector<int64_t>& image_shape) const {
  std::vector<int64_t> out = image_shape;
  out[1] = info().latent_channels;
  out[2] = 1 + (image_shape[2] - 1) / kChunkFrames;
  const int64_t p = config_.patch();
  out[3] = DownsampledRowLevels(image_shape[3] / p, Downsamplers(config_)).back().rows;
  out[4] = DownsampledRowLevels(image_shape[4] / p, Downsamplers(config_)).back().rows;
  return out;
}

std::vector<RowLevel> WanEncoder::RowLevels(int64_t input_rows) const {
  const int64_t p = config_.patch();
  std::vector<RowLevel> levels = DownsampledRowLevels(input_rows / p, Downsamplers(config_));
  if (p > 1) levels.insert(levels.begin(), RowLevel{input_rows, levels.front().per_latent_row * p});
  return levels;
}

at::Tensor WanEncoder::Moments(const at::Tensor& image, LayerOps& ops) {
  at::NoGradGuard no_grad;
  return module_->Encode(image.to(dtype()), ops);
}

at::Tensor WanEncoder::ToRawSpace(const at::Tensor& z) const {
  // As the pipelines write it: float32 statistics (the reciprocal taken in
  // float32), then cast to the latent's dtype.
  const int64_t c = config_.z_dim;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(z.device());
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
  const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
  if (divides_by_std_) return (z - mean.to(z.scalar_type())) / std.to(z.scalar_type());
  return (z - mean.to(z.scalar_type())) * at::reciprocal(std).to(z.scalar_type());
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadWanFamilyEncoder(const WanFamily& family, const WanConfig& config,
                                                              const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<WanEncoder> encoder, WanEncoder::Create(family, config));
  // encode() never touches the decoder side; those keys are ignored by name.
  RETURN_IF_ERROR(FillWeights(encoder->parameters_module(), files, {{"decoder.", "post_quant_conv."}, {}}, options));
  return std::unique_ptr<Encoder>(std::move(encoder));
}

absl::StatusOr<std::unique_ptr<Encoder>> LoadWanEncoder(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(WanConfig config, WanConfig::FromJson(files.config(), files.config_path()));
  return LoadWanFamilyEncoder(WanFamilySpec(), config, files, options);
}

}  // namespace vaedecode::families::wan
