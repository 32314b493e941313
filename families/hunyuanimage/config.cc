#include "families/hunyuanimage/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanimage {

std::vector<UpLayerSpec> HunyuanImageConfig::UpLayers() const {
  // HunyuanImageDecoder2D: per level layers_per_block + 1 resnets, then an
  // upsampler while i < log2(ratio) and i is not the last level; with
  // upsample_match_channel the upsampler already has the next level's width.
  const std::vector<int64_t> widths = decoder_widths();
  const int64_t levels = static_cast<int64_t>(widths.size());
  std::vector<UpLayerSpec> layers;
  int64_t in = widths.front();
  for (int64_t i = 0; i < levels; ++i) {
    int64_t out = widths[i];
    for (int64_t r = 0; r < layers_per_block + 1; ++r) {
      layers.push_back({false, in, out});
      in = out;
    }
    if ((int64_t{1} << i) < spatial_compression_ratio && i != levels - 1) {
      if (upsample_match_channel) out = widths[i + 1];
      layers.push_back({true, in, out});
      in = out;
    }
  }
  return layers;
}

std::vector<DownLayerSpec> HunyuanImageConfig::DownLayers() const {
  // HunyuanImageEncoder2D: per level layers_per_block resnets, then a
  // downsampler while i < log2(ratio) and i is not the last level; with
  // downsample_match_channel it already has the next level's width.
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  std::vector<DownLayerSpec> layers;
  int64_t in = block_out_channels.front();
  for (int64_t i = 0; i < levels; ++i) {
    int64_t out = block_out_channels[i];
    for (int64_t r = 0; r < layers_per_block; ++r) {
      layers.push_back({false, in, out});
      in = out;
    }
    if ((int64_t{1} << i) < spatial_compression_ratio && i != levels - 1) {
      if (downsample_match_channel) out = block_out_channels[i + 1];
      layers.push_back({true, in, out});
      in = out;
    }
  }
  return layers;
}

int64_t HunyuanImageConfig::downsamplers() const {
  int64_t n = 0;
  for (const DownLayerSpec& l : DownLayers()) n += l.downsample ? 1 : 0;
  return n;
}

absl::Status HunyuanImageConfig::CheckEncoder() const {
  const int64_t last = block_out_channels.back();
  if (last % (2 * latent_channels) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the encoder's last width ", last, " is not a multiple of 2 x ",
                                                   latent_channels, " latent channels (its output shortcut)"));
  }
  for (const DownLayerSpec& l : DownLayers()) {
    if (!l.downsample && l.in_channels != l.out_channels) {
      return absl::InvalidArgumentError(
          absl::StrCat("an encoder resnet would go from ", l.in_channels, " to ", l.out_channels,
                       " channels, which AutoencoderKLHunyuanImage cannot encode (set downsample_match_channel)"));
    }
    if (l.downsample && (l.out_channels % 4 != 0 || (4 * l.in_channels) % l.out_channels != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("a downsampler from ", l.in_channels, " to ", l.out_channels,
                                                     " channels has no whole channel groups for its shortcut"));
    }
  }
  return absl::OkStatus();
}

int64_t HunyuanImageConfig::spatial_factor() const {
  int64_t f = 1;
  for (const UpLayerSpec& l : UpLayers()) f *= l.upsample ? 2 : 1;
  return f;
}

absl::StatusOr<HunyuanImageConfig> HunyuanImageConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  HunyuanImageConfig c;
  for (const char* key : {"latent_channels", "out_channels", "block_out_channels", "layers_per_block",
                          "spatial_compression_ratio", "sample_size"}) {
    if (!json.contains(key) || json[key].is_null()) {
      r.Fail(absl::StrCat("\"", key, "\" is required (AutoencoderKLHunyuanImage has no default for it)"));
    }
  }
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.spatial_compression_ratio = r.Int("spatial_compression_ratio", c.spatial_compression_ratio);
  c.sample_size = r.Int("sample_size", c.sample_size);
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  c.upsample_match_channel = r.Bool("upsample_match_channel", c.upsample_match_channel);
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.downsample_match_channel = r.Bool("downsample_match_channel", c.downsample_match_channel);
  RETURN_IF_ERROR(r.status());

  if (c.block_out_channels.empty()) r.Fail("\"block_out_channels\" must not be empty");
  if (c.latent_channels < 1 || c.out_channels < 1 || c.layers_per_block < 0 || c.sample_size < 1) {
    r.Fail("latent_channels, out_channels and sample_size must be positive, layers_per_block non-negative");
  }
  if (c.spatial_compression_ratio < 1 || (c.spatial_compression_ratio & (c.spatial_compression_ratio - 1)) != 0) {
    r.Fail(absl::StrCat("spatial_compression_ratio ", c.spatial_compression_ratio, " is not a power of 2"));
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  RETURN_IF_ERROR(r.status());

  for (int64_t width : c.block_out_channels) {
    if (width < 1 || width % kNormGroups != 0) {
      r.Fail(absl::StrCat("block width ", width, " is not a positive multiple of 32 (the decoder's GroupNorm groups)"));
    }
  }
  const int64_t first = c.decoder_widths().front();
  if (first % c.latent_channels != 0) {
    r.Fail(absl::StrCat("the decoder's first width ", first, " (block_out_channels[-1]) is not a multiple of ",
                        c.latent_channels, " latent channels (conv_in's repeat shortcut)"));
  }
  RETURN_IF_ERROR(r.status());
  for (const UpLayerSpec& l : c.UpLayers()) {
    if (!l.upsample && l.in_channels != l.out_channels) {
      // HunyuanImageResnetBlock applies its conv_shortcut to the conv output,
      // not to the residual: diffusers cannot run a width-changing resnet.
      r.Fail(absl::StrCat("a decoder resnet would go from ", l.in_channels, " to ", l.out_channels,
                          " channels, which AutoencoderKLHunyuanImage cannot decode (set upsample_match_channel, "
                          "or give the levels without an upsampler equal widths)"));
      break;
    }
    if (l.upsample && (4 * l.out_channels) % l.in_channels != 0) {
      r.Fail(absl::StrCat("an upsampler from ", l.in_channels, " to ", l.out_channels,
                          " channels has no whole channel repeat for its shortcut (4 * out must be a multiple of in)"));
      break;
    }
  }
  // The ratio picks which levels upsample (diffusers' rule, UpLayers); with
  // fewer levels than it needs they upsample less, and diffusers decodes
  // such a model as its levels say: so do we, with a warning.
  if (c.spatial_factor() != c.spatial_compression_ratio) {
    c.structure_warnings.push_back(absl::StrCat("spatial_compression_ratio is ", c.spatial_compression_ratio, " but ",
                                                c.block_out_channels.size(), " levels upsample ", c.spatial_factor(),
                                                "x; decoded as the levels say (as diffusers does)"));
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::hunyuanimage
