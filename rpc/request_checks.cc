#include "rpc/request_checks.h"

#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace vaedecode::rpc {
namespace {

constexpr size_t kMaxRequestIdLength = 128;

}  // namespace

absl::Status ValidateLatentScaling(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (!request.has_scaling_factor()) {
    if (request.has_shift_factor()) {
      return absl::InvalidArgumentError("shift_factor: set without scaling_factor; send both (scaling 1 for a shift alone)");
    }
    return absl::OkStatus();
  }
  const double scale = request.scaling_factor();
  if (!std::isfinite(scale) || scale == 0) {
    return absl::InvalidArgumentError(absl::StrCat("scaling_factor: ", scale, "; must be finite and non-zero"));
  }
  if (request.has_shift_factor() && !std::isfinite(request.shift_factor())) {
    return absl::InvalidArgumentError(absl::StrCat("shift_factor: ", request.shift_factor(), "; must be finite"));
  }
  if (request.latent_space() != v1::LATENT_SPACE_RAW) {
    return absl::InvalidArgumentError(
        "scaling_factor: applies to raw latents; send latent_space RAW (a VAE-space latent is decoded as it is)");
  }
  if (model.raw_patch() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scaling_factor: model \"", model.name(), "\" takes packed raw latents (", model.raw_to_vae_formula(),
        "); send latent_space RAW without scaling_factor/shift_factor"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDecodeNoise(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (!request.has_decode_timestep() && !request.has_decode_noise_scale() && !request.has_noise_seed()) {
    return absl::OkStatus();
  }
  if (!model.timestep_conditioning()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode_timestep / decode_noise_scale / noise_seed: model \"", model.name(),
        "\" is not timestep-conditioned (its config's timestep_conditioning is false)"));
  }
  for (const auto& [name, set, value] :
       {std::tuple<const char*, bool, double>{"decode_timestep", request.has_decode_timestep(), request.decode_timestep()},
        std::tuple<const char*, bool, double>{"decode_noise_scale", request.has_decode_noise_scale(),
                                              request.decode_noise_scale()}}) {
    if (set && (!std::isfinite(value) || value < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", value, "; must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDecodeOptions(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (request.request_id().size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", request.request_id().size(),
                                                   " characters; at most ", kMaxRequestIdLength));
  }
  if (!v1::LatentSpace_IsValid(request.latent_space())) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent_space: unknown value ", static_cast<int>(request.latent_space())));
  }
  if (!v1::Mode_IsValid(request.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: unknown value ", static_cast<int>(request.mode())));
  }
  if (!v1::OutputFormat_IsValid(request.output_format())) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_format: unknown value ", static_cast<int>(request.output_format())));
  }
  if (request.jpeg_quality() < 0 || request.jpeg_quality() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("jpeg_quality: ", request.jpeg_quality(), "; use 1..100 (0: the default, 75)"));
  }
  if (request.fps() < 0 || request.fps() > 240) {
    return absl::InvalidArgumentError(absl::StrCat("fps: ", request.fps(), "; use 1..240 (0: the default, 16)"));
  }
  if (absl::Status s = ValidateLatentScaling(request, model); !s.ok()) return s;
  if (absl::Status s = ValidateDecodeNoise(request, model); !s.ok()) return s;
  return absl::OkStatus();
}

absl::Status ValidateOutputFormat(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (request.output_format() == v1::OUTPUT_UINT8 || request.output_format() == v1::OUTPUT_PNG) {
    const int64_t c = model.out_channels();
    if (c != 0 && c != 1 && c != 3 && c != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("output_format: ", v1::OutputFormat_Name(request.output_format()),
                       " needs 1, 3 or 4 output channels; model \"", model.name(), "\" has ", c));
    }
  }
  if (request.output_format() == v1::OUTPUT_MP4 && (!model.is_video() || (model.out_channels() != 0 && model.out_channels() != 3))) {
    return absl::InvalidArgumentError(absl::StrCat("output_format: OUTPUT_MP4 needs a video model with 3 output channels; model \"",
                                                   model.name(), "\" is ", model.is_video() ? "a video model with " : "an image model with ",
                                                   model.out_channels(), " (use OUTPUT_PNG or OUTPUT_JPEG)"));
  }
  if (request.output_format() == v1::OUTPUT_JPEG) {
    const int64_t c = model.out_channels();
    if (c != 0 && c != 1 && c != 3) {
      return absl::InvalidArgumentError(absl::StrCat("output_format: OUTPUT_JPEG needs 1 or 3 output channels; model \"",
                                                     model.name(), "\" has ", c, " (use OUTPUT_PNG)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::rpc
