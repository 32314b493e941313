#pragma once

// Constructor arguments of diffusers' AutoencoderKLMiniMaxH3Audio (MiniMax-H3's
// mono waveform VAE: a DAC-lineage encoder, a BigVGAN decoder) that shape its
// decode path, with diffusers' defaults.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families::minimax_h3_audio {

struct MiniMaxH3AudioConfig {
  int64_t encoder_dim = 64;                              // the DAC encoder's first width, doubled every stage
  std::vector<int64_t> encoder_rates = {2, 4, 4, 5, 5};  // their product is the hop (samples per latent)
  int64_t num_attention_heads = 8;                       // the encoder's pre_block
  int64_t latent_dim = 2048;                             // dec_in_proj's output, BigVGAN's input
  int64_t latent_channels = 32;
  int64_t decoder_dim = 1024;  // BigVGAN's first width, halved by every upsampler
  std::vector<int64_t> decoder_rates = {5, 5, 2, 2, 2, 2, 2};
  std::vector<int64_t> decoder_kernel_sizes = {9, 9, 4, 4, 4, 4, 4};
  std::vector<int64_t> resblock_kernel_sizes = {3, 7, 11};
  std::vector<std::vector<int64_t>> resblock_dilation_sizes = {{1, 3, 5}, {1, 3, 5}, {1, 3, 5}};
  int64_t sampling_rate = 32000;
  std::vector<double> latents_mean;  // empty: none (the pipeline then cannot de-normalise)
  std::vector<double> latents_std;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;

  // BigVGAN's anti-aliased activations: 2x up, activation, 2x down, with
  // 12-tap Kaiser-sinc filters (stored in the checkpoint as buffers).
  static constexpr int64_t kActivationRatio = 2;
  static constexpr int64_t kFilterTaps = 12;

  int64_t hop() const;  // samples per latent frame: prod(decoder_rates)
  // The encode side's own limits (diffusers builds it, but cannot run it).
  absl::Status CheckEncoder() const;
  // Samples `latent_frames` decode to: hop · latent_frames when every
  // upsampler's kernel - rate is even (the released model's), a few more otherwise.
  int64_t Samples(int64_t latent_frames) const;

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<MiniMaxH3AudioConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::minimax_h3_audio
