#pragma once

// Constructor arguments of diffusers' AutoencoderKLLTX2Audio (LTX-2's stereo
// mel-spectrogram VAE, autoencoders/autoencoder_kl_ltx2_audio.py) and of the
// LTX2Vocoder that turns its mel spectrograms into waveforms
// (pipelines/ltx2/vocoder.py), with diffusers' defaults.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::families::ltx2_audio {

// Which side of the (time, mel) plane the convolutions are causal on.
enum class CausalityAxis {
  kNone,                // symmetric padding
  kWidth,               // causal over mel bins; upsamplers drop the first column
  kHeight,              // causal over time (LTX-2's); upsamplers drop the first row
  kWidthCompatibility,  // padded like width, upsamplers crop nothing
};

struct LTX2AudioConfig {
  int64_t base_channels = 128;
  int64_t output_channels = 2;  // stereo
  std::vector<int64_t> ch_mult = {1, 2, 4};
  int64_t num_res_blocks = 2;
  std::vector<int64_t> attn_resolutions;  // empty: no attention blocks
  int64_t in_channels = 2;                // the encoder's input channels
  int64_t resolution = 256;               // only decides which levels attend
  int64_t latent_channels = 8;
  bool group_norm = false;  // norm_type "group" (GroupNorm 32, eps 1e-6); "pixel" otherwise
  CausalityAxis causality_axis = CausalityAxis::kHeight;
  bool mid_block_add_attention = false;
  int64_t sample_rate = 16000;  // of the mel spectrogram's audio
  int64_t mel_hop_length = 160;
  int64_t mel_bins = 64;  // 0: null (the decode keeps the latent's own mel bins)
  bool double_z = true;
  std::vector<std::string> unread_keys;

  // diffusers' LATENT_DOWNSAMPLE_FACTOR: the decode's target is
  // max(4·L - 3, 1) mel frames whatever ch_mult builds (cropped or zero-padded).
  static constexpr int64_t kLatentDownsampleFactor = 4;

  int64_t levels() const { return static_cast<int64_t>(ch_mult.size()); }
  int64_t MelFrames(int64_t latent_frames) const;
  // The encoder side's own limits (diffusers builds it, but cannot run it).
  absl::Status CheckEncoder() const;

  static absl::StatusOr<LTX2AudioConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

struct LTX2VocoderConfig {
  int64_t in_channels = 128;  // the mel's channels · mel bins
  int64_t hidden_channels = 1024;
  int64_t out_channels = 2;
  std::vector<int64_t> upsample_kernel_sizes = {16, 15, 8, 4, 4};
  std::vector<int64_t> upsample_factors = {6, 5, 2, 2, 2};
  std::vector<int64_t> resnet_kernel_sizes = {3, 7, 11};
  std::vector<std::vector<int64_t>> resnet_dilations = {{1, 3, 5}, {1, 3, 5}, {1, 3, 5}};
  std::string act_fn = "leaky_relu";  // or "snake", "snakebeta"
  double leaky_relu_negative_slope = 0.1;
  bool antialias = false;
  int64_t antialias_ratio = 2;
  int64_t antialias_kernel_size = 12;
  std::string final_act_fn = "tanh";  // "tanh", "clamp" or "" (null)
  bool final_bias = true;
  int64_t output_sampling_rate = 24000;
  std::vector<std::string> unread_keys;

  bool snake() const { return act_fn != "leaky_relu"; }
  int64_t hop() const;  // waveform samples per mel frame: prod(upsample_factors)
  // Samples `mel_frames` frames become (each ConvTranspose1d's output length).
  int64_t Samples(int64_t mel_frames) const;

  static absl::StatusOr<LTX2VocoderConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::ltx2_audio
