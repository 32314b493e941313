#include "server/fuzz_models.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace vaedecode::server {
namespace {

std::vector<v1::ModelInfo> MakeModels() {
  std::vector<v1::ModelInfo> models;
  v1::ModelInfo image;  // FLUX.1-like
  image.set_name("image");
  image.set_family("autoencoder_kl");
  image.set_latent_channels(16);
  image.set_out_channels(3);
  image.set_spatial_factor(8);
  image.set_scaling_factor(0.3611);
  image.set_shift_factor(0.1159);
  image.set_dtype("float32");
  models.push_back(image);

  v1::ModelInfo flux2 = image;  // packed raw latents
  flux2.set_name("flux2");
  flux2.set_family("flux2");
  flux2.set_latent_channels(32);
  flux2.set_raw_latent_channels(128);
  flux2.set_raw_patch(2);
  models.push_back(flux2);

  v1::ModelInfo video = image;  // Wan-like
  video.set_name("video");
  video.set_family("wan");
  video.set_is_video(true);
  video.set_temporal_factor(4);
  video.set_streams(true);  // DecodeSession
  video.set_session_state_bytes_per_latent(4096);
  video.set_session_chunk_frames(4);
  models.push_back(video);

  v1::ModelInfo ltx = video;  // timestep-conditioned
  ltx.set_name("ltx");
  ltx.set_family("ltx2");
  ltx.set_streams(false);
  ltx.set_streams_note("its decoder is not causal");
  ltx.set_session_state_bytes_per_latent(0);
  ltx.set_session_chunk_frames(0);
  ltx.set_latent_channels(128);
  ltx.set_spatial_factor(32);
  ltx.set_temporal_factor(8);
  ltx.set_timestep_conditioning(true);
  models.push_back(ltx);

  v1::ModelInfo windows = video;  // MiniMax-H3's output frame table; its sessions need a last_chunk
  windows.set_session_holds_clip_end(true);
  windows.set_peak_latent_frames(3);
  windows.set_session_chunk_frames(22);
  windows.set_name("windows");
  windows.set_family("minimax_h3");
  windows.set_spatial_factor(16);
  for (int64_t f : {0, 1, 5, 9, 13, 17, 18, 22, 26}) windows.add_output_frame_table(f);
  windows.set_output_frame_period(4);
  windows.set_output_frames_per_period(17);
  models.push_back(windows);

  v1::ModelInfo half = image;  // a float16 decode: values beyond 65504 refused
  half.set_name("half");
  half.set_dtype("float16");
  half.set_latent_channels(4);
  models.push_back(half);

  v1::ModelInfo rgba = image;  // an output PNG and uint8 take, JPEG and MP4 do not
  rgba.set_name("rgba");
  rgba.set_out_channels(4);
  models.push_back(rgba);

  v1::ModelInfo audio;  // LTX-2's audio VAE with its vocoder: [B, C, L, M] or packed raw [B, L, C·M]
  audio.set_name("audio");
  audio.set_family("ltx2_audio");
  audio.set_is_audio(true);
  audio.set_latent_channels(8);
  audio.set_raw_latent_channels(8);
  audio.set_latent_bins(16);
  audio.set_out_channels(2);
  audio.set_sample_rate(24000);
  audio.set_samples_per_latent(960);
  audio.set_scaling_factor(1.0);
  audio.set_dtype("float32");
  audio.set_streams_note("an audio VAE");
  models.push_back(audio);
  return models;
}

const std::vector<v1::ModelInfo>& Models() {
  static const std::vector<v1::ModelInfo>* models = new std::vector<v1::ModelInfo>(MakeModels());
  return *models;
}

}  // namespace

const v1::ModelInfo& FuzzModel(uint8_t selector) { return Models()[selector % Models().size()]; }

absl::StatusOr<v1::ModelInfo> FuzzModelNamed(const std::string& name) {
  for (const v1::ModelInfo& m : Models()) {
    if (m.name() == name) return m;
  }
  return absl::NotFoundError(absl::StrCat("unknown model \"", name, "\""));
}

}  // namespace vaedecode::server
