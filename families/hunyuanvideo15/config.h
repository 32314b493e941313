#pragma once

// Constructor arguments of diffusers' AutoencoderKLHunyuanVideo15
// (HunyuanVideo 1.5) that shape its decode path, with diffusers' defaults.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families::hunyuanvideo15 {

// One decoder up block (HunyuanVideo15UpBlock3D), in decode order.
struct UpBlockSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 0;
  // The upsampler's output width; 0 = no upsampler (-1: one past the last
  // level, which FromJson refuses). Every upsampler doubles
  // H and W; `upsample_time` also doubles the frames after the first.
  int64_t upsample_out_channels = 0;
  bool upsample_time = false;
};

// One HunyuanVideo15DownBlock3D of the encoder, in encode order.
struct DownBlockSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 0;
  // The downsampler's width; 0 without one (diffusers' None), -1 when
  // diffusers would index past block_out_channels (CheckEncoder refuses).
  int64_t downsample_out_channels = 0;
  bool downsample_time = false;
};

struct HunyuanVideo15Config {
  int64_t in_channels = 3;  // the image's (encoder side)
  bool downsample_match_channel = true;
  int64_t latent_channels = 32;
  int64_t out_channels = 3;
  // Encoder order; the decoder runs them reversed (widest first).
  std::vector<int64_t> block_out_channels = {128, 256, 512, 1024, 1024};
  int64_t layers_per_block = 2;
  int64_t spatial_compression_ratio = 16;
  int64_t temporal_compression_ratio = 4;
  bool upsample_match_channel = true;
  double scaling_factor = 1.03682;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;

  // AutoencoderKLHunyuanVideo15.__init__'s spatial tile (not in config.json).
  static constexpr int64_t kTileSampleMinSize = 256;

  std::vector<int64_t> decoder_widths() const { return {block_out_channels.rbegin(), block_out_channels.rend()}; }
  // The up blocks as HunyuanVideo15Decoder3D builds them.
  std::vector<UpBlockSpec> UpBlocks() const;
  // HunyuanVideo15Encoder3D's down blocks as it builds them.
  std::vector<DownBlockSpec> DownBlocks() const;
  int64_t encoder_spatial_factor() const;   // 2^(downsamplers)
  int64_t encoder_temporal_factor() const;  // 2^(temporal downsamplers)
  // OK when diffusers can build and run this config's encoder; why not otherwise.
  absl::Status CheckEncoder() const;
  int64_t spatial_factor() const;   // 2^(upsamplers)
  int64_t temporal_factor() const;  // 2^(temporal upsamplers)
  // decoder.conv_in's shortcut: the latent's channels repeated this often.
  int64_t conv_in_repeats() const { return decoder_widths().front() / latent_channels; }

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<HunyuanVideo15Config> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::hunyuanvideo15
