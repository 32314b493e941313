#pragma once

// Constructor arguments of diffusers' AutoencoderKLHunyuanVideo that shape
// its decode path, with diffusers' defaults, plus the decode-time constants of
// its temporal tiling (diffusers decodes more than
// tile_sample_min_num_frames / temporal_compression_ratio latent frames in
// overlapping temporal tiles by default: use_framewise_decoding is true).

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families::hunyuanvideo {

// One decoder up block (HunyuanVideoUpBlock3D), in decode order.
struct UpBlockSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 0;
  bool upsample_time = false;   // upsample_scale_factor T = 2
  bool upsample_space = false;  // upsample_scale_factor H, W = 2
};

// One encoder down block (HunyuanVideoDownBlock3D), in encode order.
struct DownBlockSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t num_layers = 0;
  bool downsample_time = false;   // the downsampler's stride in T is 2
  bool downsample_space = false;  // its stride in H and W is 2
};

struct HunyuanVideoConfig {
  int64_t in_channels = 3;                    // the image's (encoder side)
  std::vector<std::string> down_block_types;  // every entry HunyuanVideoDownBlock3D (checked by CheckEncoder)
  int64_t latent_channels = 16;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  std::string act_fn = "silu";
  double scaling_factor = 0.476986;
  int64_t spatial_compression_ratio = 8;
  int64_t temporal_compression_ratio = 4;
  bool mid_block_add_attention = true;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;

  // AutoencoderKLHunyuanVideo.__init__'s tiling constants (not in config.json).
  static constexpr int64_t kTileSampleMinNumFrames = 16;
  static constexpr int64_t kTileSampleStrideNumFrames = 12;

  // The down blocks as HunyuanVideoEncoder3D builds them.
  std::vector<DownBlockSpec> DownBlocks() const;
  int64_t encoder_spatial_downsamplers() const;  // each rounds the rows up: ceil(rows / 2)
  // OK when diffusers can build this config's encoder; why not otherwise.
  absl::Status CheckEncoder() const;

  // The up blocks as HunyuanVideoDecoder3D builds them.
  std::vector<UpBlockSpec> UpBlocks() const;
  int64_t spatial_factor() const;   // 2^(spatially upsampling blocks)
  int64_t temporal_factor() const;  // 2^(temporally upsampling blocks)

  // Latent frames decoded in one piece; more go through temporal tiles.
  int64_t tile_latent_min_frames() const { return kTileSampleMinNumFrames / temporal_compression_ratio; }
  int64_t tile_latent_stride_frames() const { return kTileSampleStrideNumFrames / temporal_compression_ratio; }
  int64_t blend_frames() const { return kTileSampleMinNumFrames - kTileSampleStrideNumFrames; }

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<HunyuanVideoConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::hunyuanvideo
