#pragma once

// Constructor arguments of diffusers' AutoencoderKLHunyuanImage
// (HunyuanImage-2.1) that shape its decode path. The class has no defaults
// for the structure (in diffusers a missing key is a TypeError), so those
// keys are required here too.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families::hunyuanimage {

// One entry of HunyuanImageDecoder2D's flat up_blocks list, in decode order.
struct UpLayerSpec {
  bool upsample = false;  // HunyuanImageUpsample; otherwise HunyuanImageResnetBlock
  int64_t in_channels = 0;
  int64_t out_channels = 0;
};

// One entry of HunyuanImageEncoder2D's flat down_blocks list, in encode order.
struct DownLayerSpec {
  bool downsample = false;  // HunyuanImageDownsample; otherwise HunyuanImageResnetBlock
  int64_t in_channels = 0;
  int64_t out_channels = 0;
};

struct HunyuanImageConfig {
  int64_t in_channels = 3;  // the image's (encoder side; required by diffusers, 3 when absent here)
  int64_t latent_channels = 0;
  int64_t out_channels = 0;
  // Encoder order; the decoder runs them reversed (widest first).
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block = 0;
  int64_t spatial_compression_ratio = 0;
  int64_t sample_size = 0;  // pixels: diffusers' tile_sample_min_size
  double scaling_factor = 1.0;
  bool upsample_match_channel = true;
  bool downsample_match_channel = true;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;
  // Structure keys that disagree with the levels (ModelInfo::config_warnings).
  std::vector<std::string> structure_warnings;

  // HunyuanImageResnetBlock and HunyuanImageAttentionBlock: GroupNorm(32, C, 1e-6).
  static constexpr int64_t kNormGroups = 32;
  static constexpr double kNormEps = 1e-6;

  std::vector<int64_t> decoder_widths() const { return {block_out_channels.rbegin(), block_out_channels.rend()}; }
  // HunyuanImageDecoder2D's up_blocks as it builds them.
  std::vector<UpLayerSpec> UpLayers() const;
  // HunyuanImageEncoder2D's down_blocks as it builds them.
  std::vector<DownLayerSpec> DownLayers() const;
  int64_t downsamplers() const;  // the encoder's: each halves the image
  // OK when diffusers can build and run this config's encoder; why not otherwise.
  absl::Status CheckEncoder() const;
  int64_t spatial_factor() const;  // 2^(upsamplers)
  // decoder.conv_in's shortcut: the latent's channels repeated this often.
  int64_t conv_in_repeats() const { return decoder_widths().front() / latent_channels; }

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<HunyuanImageConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::hunyuanimage
