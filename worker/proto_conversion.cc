#include "worker/proto_conversion.h"

#include <algorithm>
#include <cstring>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/image_input.h"
#include "rpc/latent_tensor.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

void DescribeModel(const NamedModel& m, const tiling::PeakProfile& profile, int world_size, v1::ModelInfo* out,
                   double session_state_bytes_per_latent) {
  const families::ModelInfo& info = m.decoder->info();
  out->set_name(m.name);
  out->set_family(info.family);
  out->set_diffusers_class(info.diffusers_class);
  out->set_config_json(info.config_json);
  out->set_latent_channels(info.latent_channels);
  out->set_raw_latent_channels(info.raw_latent_channels > 0 ? info.raw_latent_channels : info.latent_channels);
  out->set_raw_patch(info.raw_patch);
  out->set_out_channels(info.out_channels);
  out->set_spatial_factor(info.spatial_factor);
  out->set_temporal_factor(info.temporal_factor);
  out->set_is_video(info.is_video);
  out->set_is_audio(info.is_audio);
  out->set_sample_rate(info.sample_rate);
  out->set_samples_per_latent(info.samples_per_latent);
  out->set_latent_bins(info.latent_bins);
  out->set_mel_frames_per_latent(info.mel_frames_per_latent);
  out->set_mel_bins(info.mel_bins);
  for (int64_t frames : info.output_frames.frames) out->add_output_frame_table(frames);
  out->set_output_frame_period(info.output_frames.period);
  out->set_output_frames_per_period(info.output_frames.frames_per_period);
  out->set_peak_latent_frames(info.peak_latent_frames);
  out->set_timestep_conditioning(info.timestep_conditioning);
  out->set_scaling_factor(info.scaling_factor);
  if (info.shift_factor) out->set_shift_factor(*info.shift_factor);
  out->set_raw_to_vae_formula(info.raw_to_vae_formula);
  out->set_decode_note(info.decode_note);
  out->set_parameter_count(info.parameter_count);
  out->set_dtype(families::DtypeName(m.decoder->dtype()));
  out->set_peak_bytes_per_latent(profile.bytes_per_latent);
  out->set_fixed_peak_bytes(profile.fixed_bytes);
  out->set_attention_bytes_per_latent_pair(profile.attention_bytes_per_latent_pair);
  out->set_attention_fixed_bytes(profile.attention_fixed_bytes);
  out->set_attention_bytes_per_latent(profile.attention_bytes_per_latent);
  out->add_supported_modes(v1::MODE_DENSE);
  if (info.spatial_tiling) out->add_supported_modes(v1::MODE_TILED);
  // A one-row latent is always shardable if the family shards at all.
  const std::vector<int64_t> probe = info.is_video ? std::vector<int64_t>{1, info.latent_channels, 1, 64, 64}
                                                   : std::vector<int64_t>{1, info.latent_channels, 64, 64};
  if (world_size > 1 && !info.is_audio && m.decoder->CheckExactSharding(probe, world_size).ok()) {
    out->add_supported_modes(v1::MODE_EXACT);
  }
  const absl::Status streams = m.decoder->CheckStreaming();
  out->set_streams(streams.ok());
  out->set_streams_note(std::string(streams.message()));
  out->set_session_holds_clip_end(streams.ok() && info.stream_holds_clip_end);
  if (streams.ok()) {
    // Past the output frame table (and its period, twice) every window
    // geometry repeats.
    const int64_t horizon = static_cast<int64_t>(info.output_frames.frames.size()) + 2 * info.output_frames.period + 8;
    int64_t most = 0;
    for (int64_t t = 1; t <= horizon; ++t) {
      const int64_t before = m.decoder->StreamedFrames(t - 1, /*clip_ended=*/false);
      most =
          std::max({most, m.decoder->StreamedFrames(t, false) - before, m.decoder->StreamedFrames(t, true) - before});
    }
    out->set_session_chunk_frames(most);
  }
  out->set_session_state_bytes_per_latent(session_state_bytes_per_latent);
}

absl::StatusOr<at::Tensor> LatentFromRequest(const v1::Tensor& latent) {
  // The server refused a bad latent with the same checks; they guard the copy.
  if (absl::StatusOr<int64_t> numel = rpc::ValidateLatentTensor(latent); !numel.ok()) return numel.status();
  const at::ScalarType type = latent.dtype() == v1::FLOAT16    ? at::kHalf
                              : latent.dtype() == v1::BFLOAT16 ? at::kBFloat16
                                                               : at::kFloat;
  at::Tensor t =
      at::empty(std::vector<int64_t>(latent.shape().begin(), latent.shape().end()), at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), latent.data().data(), latent.data().size());
  return t;
}

absl::StatusOr<at::Tensor> ImageFromRequest(const v1::EncodeRequest& request) {
  if (!request.encoded_image().empty()) {
    if (request.has_image()) return absl::InvalidArgumentError("image and encoded_image: send one of the two");
    return formats::DecodeImageBytes(request.encoded_image());
  }
  if (!request.has_image()) return absl::InvalidArgumentError("image: missing (send image or encoded_image)");
  const v1::Tensor& image = request.image();
  if (image.dtype() != v1::UINT8) {
    // The latent's checks, their messages naming the image's fields.
    absl::StatusOr<at::Tensor> floats = LatentFromRequest(image);
    if (!floats.ok() && absl::StartsWith(floats.status().message(), "latent")) {
      return absl::InvalidArgumentError(absl::StrCat("image", floats.status().message().substr(6)));
    }
    return floats;
  }
  ASSIGN_OR_RETURN(int64_t numel, rpc::CountElements(image.shape(), "image.shape"));
  if (static_cast<int64_t>(image.data().size()) != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("image.data: ", image.data().size(), " bytes for ", numel, " UINT8 pixels of the shape"));
  }
  if (image.shape_size() != 4 && image.shape_size() != 5) {
    return absl::InvalidArgumentError("image: UINT8 pixels are [B, H, W, C] or [B, T, H, W, C]");
  }
  at::Tensor pixels = at::empty(std::vector<int64_t>(image.shape().begin(), image.shape().end()), at::kByte);
  std::memcpy(pixels.data_ptr(), image.data().data(), image.data().size());
  // Channels first, as the float layout: [B, C, (T,) H, W].
  const at::Tensor unit = pixels.to(at::kFloat) / 255.0;
  at::Tensor floats = 2.0 * unit - 1.0;
  floats = image.shape_size() == 4 ? floats.permute({0, 3, 1, 2}) : floats.permute({0, 4, 1, 2, 3});
  return floats.contiguous();
}

EncodeJob EncodeJobFromRequest(const v1::EncodeRequest& request, at::Tensor image) {
  EncodeJob job;
  job.image = std::move(image);
  job.from_pixels = !request.encoded_image().empty() || (request.has_image() && request.image().dtype() == v1::UINT8);
  job.posterior = request.posterior() == v1::POSTERIOR_SAMPLE    ? families::PosteriorOutput::kSample
                  : request.posterior() == v1::POSTERIOR_MOMENTS ? families::PosteriorOutput::kMoments
                                                                 : families::PosteriorOutput::kMean;
  if (request.has_seed()) job.seed = request.seed();
  job.latent_space =
      request.latent_space() == v1::LATENT_SPACE_RAW ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
  return job;
}

DecodeJob JobFromRequest(const v1::DecodeRequest& request, at::Tensor latent) {
  DecodeJob job;
  job.latent = std::move(latent);
  job.latent_space =
      request.latent_space() == v1::LATENT_SPACE_RAW ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
  if (request.has_decode_timestep()) job.conditioning.timestep = request.decode_timestep();
  job.conditioning.mel_spectrogram = request.audio_output() == v1::AUDIO_OUTPUT_MEL;
  // LTX2Pipeline's decode noise scale defaults to its decode timestep.
  job.noise_scale = request.has_decode_noise_scale() ? request.decode_noise_scale() : request.decode_timestep();
  if (request.has_noise_seed()) job.noise_seed = request.noise_seed();
  if (request.has_scaling_factor()) job.scaling_factor = request.scaling_factor();
  if (request.has_shift_factor()) job.shift_factor = request.shift_factor();
  return job;
}

}  // namespace vaedecode::worker
