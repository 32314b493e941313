#include "rpc/request_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "rpc/output_formats.h"
#include "rpc/request_options.h"
#include "rpc/status_macros.h"

namespace vaedecode::rpc {

absl::Status ValidateLatentScaling(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (!request.has_scaling_factor()) {
    if (request.has_shift_factor()) {
      return absl::InvalidArgumentError(
          "shift_factor: set without scaling_factor; send both (scaling 1 for a shift alone)");
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
    return absl::InvalidArgumentError(absl::StrCat("scaling_factor: model \"", model.name(),
                                                   "\" takes packed raw latents (", model.raw_to_vae_formula(),
                                                   "); send latent_space RAW without scaling_factor/shift_factor"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDecodeNoise(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (!request.has_decode_timestep() && !request.has_decode_noise_scale() && !request.has_noise_seed()) {
    return absl::OkStatus();
  }
  if (!model.timestep_conditioning()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode_timestep / decode_noise_scale / noise_seed: model \"", model.name(),
                     "\" is not timestep-conditioned (its config's timestep_conditioning is false)"));
  }
  return absl::OkStatus();  // the values' ranges are CheckOptionRanges'
}

absl::Status ValidateDecodeOptions(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (request.request_id().size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", request.request_id().size(), " characters; at most ", kMaxRequestIdLength));
  }
  RETURN_IF_ERROR(CheckOptionRanges(request));
  RETURN_IF_ERROR(ValidateLatentScaling(request, model));
  return ValidateDecodeNoise(request, model);
}

absl::Status ValidateOutputFormat(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (!v1::AudioOutput_IsValid(request.audio_output())) {
    return absl::InvalidArgumentError(absl::StrCat("audio_output: unknown value ", request.audio_output()));
  }
  if (request.audio_output() == v1::AUDIO_OUTPUT_MEL && !model.is_audio()) {
    return absl::InvalidArgumentError(absl::StrCat("audio_output: MEL is an audio VAE's mel spectrogram; model \"",
                                                   model.name(), "\" decodes ", model.is_video() ? "video" : "images"));
  }
  // An audio VAE's output has as many channels as its waveform or mel
  // spectrogram; the formats that take it take any.
  return CheckOutputFits(request.output_format(), model.is_audio() ? 0 : model.out_channels(),
                         OutputKindOf(model, request), absl::StrCat("model \"", model.name(), "\""));
}

bool HasMuxedAudio(const v1::DecodeRequest& request) {
  return request.has_audio_latent() || !request.audio_model().empty();
}

v1::DecodeRequest MuxedAudioRequest(const v1::DecodeRequest& request) {
  v1::DecodeRequest audio;
  audio.set_model(request.audio_model());
  audio.set_request_id(request.request_id());
  audio.set_latent_space(request.audio_latent_space());
  audio.set_output_format(v1::OUTPUT_FLOAT32);
  *audio.mutable_latent() = request.audio_latent();
  return audio;
}

}  // namespace vaedecode::rpc
