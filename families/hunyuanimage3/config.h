#pragma once

// Constructor arguments of HunyuanImage-3.0's AutoencoderKLConv3D (the
// release's hunyuan_image_3/autoencoder_kl_3d.py; diffusers has no copy)
// that shape its decode and encode paths. The release gives the structure
// no defaults (a missing key is a TypeError), so those keys are required.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::families::hunyuanimage3 {

// One level of the decoder (`decoder.up.<i>`) or the encoder
// (`encoder.down.<i>`) as the release builds it: its resnets' widths, then an
// optional DCAE resampler.
struct LevelSpec {
  int64_t resnets = 0;
  int64_t in_channels = 0;   // the first resnet's input
  int64_t out_channels = 0;  // the level's width (every resnet's output)
  bool resample = false;     // UpsampleDCAE / DownsampleDCAE after the resnets
  bool temporal = false;     // ... that also doubles / halves time
  int64_t resample_out = 0;  // its output width
};

struct HunyuanImage3Config {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t latent_channels = 0;
  std::vector<int64_t> block_out_channels;  // encoder order; the decoder runs them reversed
  int64_t layers_per_block = 0;
  int64_t ffactor_spatial = 0;
  int64_t ffactor_temporal = 0;
  int64_t sample_size = 0;  // pixels: the release's spatial tile
  double scaling_factor = 1.0;
  std::optional<double> shift_factor;
  bool downsample_match_channel = true;
  bool upsample_match_channel = true;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;
  // Structure keys that disagree with the levels (ModelInfo::config_warnings).
  std::vector<std::string> structure_warnings;

  // Its ResnetBlock, AttnBlock and output norms: GroupNorm(32, C, eps 1e-6).
  static constexpr int64_t kNormGroups = 32;
  static constexpr double kNormEps = 1e-6;

  std::vector<int64_t> decoder_widths() const { return {block_out_channels.rbegin(), block_out_channels.rend()}; }
  // The release's Decoder: per level layers_per_block + 1 resnets, then an
  // UpsampleDCAE while 2^i < ffactor_spatial (spatial) or 2^i < ffactor_temporal (and time).
  std::vector<LevelSpec> DecoderLevels() const;
  // The release's Encoder: per level layers_per_block resnets, then a
  // DownsampleDCAE while 2^i < ffactor_spatial, halving time too from
  // 2^i >= ffactor_spatial / ffactor_temporal on.
  std::vector<LevelSpec> EncoderLevels() const;
  int64_t spatial_factor() const;  // 2^(spatial upsamplers)
  int64_t decoded_frames() const;  // frames one latent frame decodes to (the last is the image)
  int64_t encoder_downsamplers() const;
  int64_t encoder_width() const;  // the encoder's mid block and output norm
  // OK when the release can build and run this config's encoder on an image
  // (expanded to ffactor_temporal frames, which must encode to one); why not otherwise.
  absl::Status CheckEncoder() const;
  // decoder.conv_in's shortcut: the latent's channels repeated this often.
  int64_t conv_in_repeats() const { return decoder_widths().front() / latent_channels; }

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<HunyuanImage3Config> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::hunyuanimage3
