#include "families/hunyuanvideo/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanvideo {
namespace {

int64_t Log2(int64_t v) {
  int64_t n = 0;
  while ((int64_t{1} << (n + 1)) <= v) ++n;
  return n;
}

}  // namespace

std::vector<DownBlockSpec> HunyuanVideoConfig::DownBlocks() const {
  // HunyuanVideoEncoder3D: spatial downsampling in the first log2(s) blocks;
  // temporal (ratio 4) in the log2(t) blocks before the last, or (ratio 8)
  // in the first log2(t).
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  const int64_t spatial_layers = Log2(spatial_compression_ratio);
  const int64_t time_layers = Log2(temporal_compression_ratio);
  std::vector<DownBlockSpec> blocks;
  int64_t out = block_out_channels.front();
  for (int64_t i = 0; i < levels; ++i) {
    DownBlockSpec b;
    b.in_channels = out;
    out = block_out_channels[i];
    b.out_channels = out;
    b.num_layers = layers_per_block;
    b.downsample_space = i < spatial_layers;
    b.downsample_time =
        temporal_compression_ratio == 8 ? i < time_layers : i >= levels - 1 - time_layers && i != levels - 1;
    blocks.push_back(b);
  }
  return blocks;
}

int64_t HunyuanVideoConfig::encoder_spatial_downsamplers() const {
  int64_t n = 0;
  for (const DownBlockSpec& b : DownBlocks()) n += b.downsample_space ? 1 : 0;
  return n;
}

absl::Status HunyuanVideoConfig::CheckEncoder() const {
  if (temporal_compression_ratio != 4 && temporal_compression_ratio != 8) {
    return absl::InvalidArgumentError(absl::StrCat("temporal_compression_ratio ", temporal_compression_ratio,
                                                   ": AutoencoderKLHunyuanVideo's encoder takes 4 or 8"));
  }
  if (!down_block_types.empty() && down_block_types.size() != block_out_channels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("\"down_block_types\" has ", down_block_types.size(),
                                                   " entries but \"block_out_channels\" has ",
                                                   block_out_channels.size()));
  }
  for (const std::string& t : down_block_types) {
    if (t != "HunyuanVideoDownBlock3D") {
      return absl::InvalidArgumentError(
          absl::StrCat("down block type \"", t, "\" is not supported (only HunyuanVideoDownBlock3D)"));
    }
  }
  return absl::OkStatus();
}

std::vector<UpBlockSpec> HunyuanVideoConfig::UpBlocks() const {
  // HunyuanVideoDecoder3D: spatial upsampling in the first log2(s) blocks,
  // temporal in the log2(t) blocks before the last (time_compression_ratio 4).
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  const int64_t spatial_layers = Log2(spatial_compression_ratio);
  const int64_t time_layers = Log2(temporal_compression_ratio);
  std::vector<UpBlockSpec> blocks;
  int64_t out = block_out_channels.back();
  for (int64_t i = 0; i < levels; ++i) {
    UpBlockSpec b;
    b.in_channels = out;
    out = block_out_channels[levels - 1 - i];
    b.out_channels = out;
    b.num_layers = layers_per_block + 1;
    const bool final_block = i == levels - 1;
    b.upsample_space = i < spatial_layers;
    b.upsample_time = i >= levels - 1 - time_layers && !final_block;
    blocks.push_back(b);
  }
  return blocks;
}

int64_t HunyuanVideoConfig::spatial_factor() const {
  int64_t f = 1;
  for (const UpBlockSpec& b : UpBlocks()) f *= b.upsample_space ? 2 : 1;
  return f;
}

int64_t HunyuanVideoConfig::temporal_factor() const {
  int64_t f = 1;
  for (const UpBlockSpec& b : UpBlocks()) f *= b.upsample_time ? 2 : 1;
  return f;
}

absl::StatusOr<HunyuanVideoConfig> HunyuanVideoConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  HunyuanVideoConfig c;
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.norm_num_groups = r.Int("norm_num_groups", c.norm_num_groups);
  c.act_fn = r.String("act_fn", c.act_fn);
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  c.spatial_compression_ratio = r.Int("spatial_compression_ratio", c.spatial_compression_ratio);
  c.temporal_compression_ratio = r.Int("temporal_compression_ratio", c.temporal_compression_ratio);
  c.mid_block_add_attention = r.Bool("mid_block_add_attention", c.mid_block_add_attention);
  const std::vector<std::string> up_blocks =
      r.StringList("up_block_types", std::vector<std::string>(c.block_out_channels.size(), "HunyuanVideoUpBlock3D"));

  if (c.block_out_channels.empty()) r.Fail("\"block_out_channels\" must not be empty");
  if (up_blocks.size() != c.block_out_channels.size()) {
    r.Fail(absl::StrCat("\"up_block_types\" has ", up_blocks.size(), " entries but \"block_out_channels\" has ",
                        c.block_out_channels.size()));
  }
  for (const std::string& t : up_blocks) {
    if (t != "HunyuanVideoUpBlock3D") {
      r.Fail(absl::StrCat("up block type \"", t, "\" is not supported (only HunyuanVideoUpBlock3D)"));
    }
  }
  r.RequireSilu(c.act_fn);
  if (c.temporal_compression_ratio != 4) {
    // HunyuanVideoDecoder3D raises for any other ratio.
    r.Fail(absl::StrCat("temporal_compression_ratio ", c.temporal_compression_ratio, " is not supported (only 4)"));
  }
  if (c.spatial_compression_ratio < 1 || (c.spatial_compression_ratio & (c.spatial_compression_ratio - 1)) != 0) {
    r.Fail(absl::StrCat("spatial_compression_ratio ", c.spatial_compression_ratio, " is not a power of 2"));
  }
  if (c.latent_channels < 1 || c.out_channels < 1 || c.layers_per_block < 0 || c.norm_num_groups < 1) {
    r.Fail("latent_channels, out_channels and norm_num_groups must be positive, layers_per_block non-negative");
  }
  for (int64_t width : c.block_out_channels) {
    if (width < 1 || (c.norm_num_groups > 0 && width % c.norm_num_groups != 0)) {
      r.Fail(absl::StrCat("block width ", width, " is not a positive multiple of norm_num_groups ", c.norm_num_groups));
    }
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  RETURN_IF_ERROR(r.status());
  // Too few levels for the ratios: the decoder would upsample less than the
  // config (and the temporal tiling) say.
  if (c.temporal_factor() != c.temporal_compression_ratio || c.spatial_factor() != c.spatial_compression_ratio) {
    r.Fail(absl::StrCat(c.block_out_channels.size(), " levels upsample ", c.spatial_factor(), "x in space and ",
                        c.temporal_factor(), "x in time, not the configured ", c.spatial_compression_ratio, "x and ",
                        c.temporal_compression_ratio, "x"));
  }
  RETURN_IF_ERROR(r.status());
  c.in_channels = r.Int("in_channels", c.in_channels);
  if (json.contains("down_block_types") && !json["down_block_types"].is_null()) {
    c.down_block_types = r.StringList("down_block_types", {});
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::hunyuanvideo
