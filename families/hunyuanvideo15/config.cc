#include "families/hunyuanvideo15/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanvideo15 {
namespace {

bool IsPowerOfTwo(int64_t v) { return v >= 1 && (v & (v - 1)) == 0; }

// Why HunyuanVideo15Upsample cannot be built or run for these widths ("" when
// it can): its shortcut unpacks the input's channels 2x2(x2) and repeats them
// up to the output's, which needs whole numbers at every step.
std::string UpsamplerProblem(const UpBlockSpec& b) {
  const int64_t in = b.out_channels, out = b.upsample_out_channels;
  const int64_t factor = b.upsample_time ? 8 : 4;
  const int64_t repeats = factor * out / in;
  const bool fits = b.upsample_time ? in % 8 == 0 && (in / 8) * repeats == out && (in / 4) * (repeats / 2) == out
                                    : in * repeats == 4 * out;
  if (fits) return "";
  return absl::StrCat("an upsampler from ", in, " to ", out, " channels", b.upsample_time ? " (with time)" : "",
                      " has no whole channel repeat for its shortcut");
}

}  // namespace

std::vector<DownBlockSpec> HunyuanVideo15Config::DownBlocks() const {
  // HunyuanVideo15Encoder3D: level i downsamples in space while
  // i < log2(spatial ratio), in time too from log2(spatial / temporal ratio)
  // on; with downsample_match_channel to the next level's width.
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  std::vector<DownBlockSpec> blocks;
  int64_t in = block_out_channels.front();
  for (int64_t i = 0; i < levels; ++i) {
    DownBlockSpec b;
    b.in_channels = in;
    b.out_channels = block_out_channels[i];
    b.num_layers = layers_per_block;
    if ((int64_t{1} << i) < spatial_compression_ratio) {
      b.downsample_time = (int64_t{1} << i) * temporal_compression_ratio >= spatial_compression_ratio;
      if (!downsample_match_channel) {
        b.downsample_out_channels = b.out_channels;
      } else {
        b.downsample_out_channels = i + 1 < levels ? block_out_channels[i + 1] : -1;
      }
    }
    in = b.downsample_out_channels > 0 ? b.downsample_out_channels : b.out_channels;
    blocks.push_back(b);
  }
  return blocks;
}

int64_t HunyuanVideo15Config::encoder_spatial_factor() const {
  int64_t f = 1;
  for (const DownBlockSpec& b : DownBlocks()) f *= b.downsample_out_channels != 0 ? 2 : 1;
  return f;
}

int64_t HunyuanVideo15Config::encoder_temporal_factor() const {
  int64_t f = 1;
  for (const DownBlockSpec& b : DownBlocks()) f *= b.downsample_out_channels != 0 && b.downsample_time ? 2 : 1;
  return f;
}

absl::Status HunyuanVideo15Config::CheckEncoder() const {
  if (block_out_channels.back() % (2 * latent_channels) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the encoder's last width ", block_out_channels.back(),
                                                   " is not a multiple of 2 x ", latent_channels,
                                                   " latent channels (its output shortcut)"));
  }
  for (const DownBlockSpec& b : DownBlocks()) {
    if (b.downsample_out_channels < 0) {
      return absl::InvalidArgumentError(
          "the encoder's last level would downsample to block_out_channels[i + 1], which does not exist "
          "(diffusers cannot build it)");
    }
    const int64_t factor = b.downsample_time ? 8 : 4;
    if (b.downsample_out_channels > 0 &&
        (b.downsample_out_channels % factor != 0 || (factor * b.out_channels) % b.downsample_out_channels != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("a downsampler from ", b.out_channels, " to ",
                                                     b.downsample_out_channels,
                                                     " channels has no whole channel groups for its shortcut"));
    }
  }
  return absl::OkStatus();
}

std::vector<UpBlockSpec> HunyuanVideo15Config::UpBlocks() const {
  // HunyuanVideo15Decoder3D: level i upsamples (always 2x in space) while
  // i < log2(spatial ratio) or i < log2(temporal ratio), in time while
  // i < log2(temporal ratio); with upsample_match_channel the upsampler
  // already has the next level's width.
  const std::vector<int64_t> widths = decoder_widths();
  const int64_t levels = static_cast<int64_t>(widths.size());
  std::vector<UpBlockSpec> blocks;
  int64_t in = widths.front();
  for (int64_t i = 0; i < levels; ++i) {
    UpBlockSpec b;
    b.in_channels = in;
    b.out_channels = widths[i];
    b.num_layers = layers_per_block + 1;
    const bool space = (int64_t{1} << i) < spatial_compression_ratio;
    b.upsample_time = (int64_t{1} << i) < temporal_compression_ratio;
    if (space || b.upsample_time) {
      if (!upsample_match_channel) {
        b.upsample_out_channels = widths[i];
      } else if (i + 1 < levels) {
        b.upsample_out_channels = widths[i + 1];
      } else {
        b.upsample_out_channels = -1;  // diffusers' block_out_channels[i + 1] fails; FromJson refuses
      }
    }
    in = b.upsample_out_channels > 0 ? b.upsample_out_channels : b.out_channels;
    blocks.push_back(b);
  }
  return blocks;
}

int64_t HunyuanVideo15Config::spatial_factor() const {
  int64_t f = 1;
  for (const UpBlockSpec& b : UpBlocks()) f *= b.upsample_out_channels != 0 ? 2 : 1;
  return f;
}

int64_t HunyuanVideo15Config::temporal_factor() const {
  int64_t f = 1;
  for (const UpBlockSpec& b : UpBlocks()) f *= b.upsample_time ? 2 : 1;
  return f;
}

absl::StatusOr<HunyuanVideo15Config> HunyuanVideo15Config::FromJson(const nlohmann::json& json,
                                                                    const std::string& source) {
  ConfigReader r(json, source);
  HunyuanVideo15Config c;
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.spatial_compression_ratio = r.Int("spatial_compression_ratio", c.spatial_compression_ratio);
  c.temporal_compression_ratio = r.Int("temporal_compression_ratio", c.temporal_compression_ratio);
  c.upsample_match_channel = r.Bool("upsample_match_channel", c.upsample_match_channel);
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.downsample_match_channel = r.Bool("downsample_match_channel", c.downsample_match_channel);
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  RETURN_IF_ERROR(r.status());

  if (c.block_out_channels.empty()) r.Fail("\"block_out_channels\" must not be empty");
  if (c.latent_channels < 1 || c.out_channels < 1 || c.layers_per_block < 0) {
    r.Fail("latent_channels and out_channels must be positive, layers_per_block non-negative");
  }
  for (int64_t width : c.block_out_channels) {
    if (width < 1) r.Fail(absl::StrCat("block width ", width, " is not positive"));
  }
  if (!IsPowerOfTwo(c.spatial_compression_ratio) || !IsPowerOfTwo(c.temporal_compression_ratio)) {
    r.Fail(absl::StrCat("spatial_compression_ratio ", c.spatial_compression_ratio, " and temporal_compression_ratio ",
                        c.temporal_compression_ratio, " must be powers of 2"));
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  RETURN_IF_ERROR(r.status());

  const int64_t first = c.decoder_widths().front();
  if (first % c.latent_channels != 0) {
    r.Fail(absl::StrCat("the decoder's first width ", first, " (block_out_channels[-1]) is not a multiple of ",
                        c.latent_channels, " latent channels (conv_in's repeat shortcut)"));
  }
  for (const UpBlockSpec& b : c.UpBlocks()) {
    if (b.upsample_out_channels < 0) {
      r.Fail(absl::StrCat(c.block_out_channels.size(),
                          " levels are too few for the compression ratios: the last level would need an upsampler "
                          "to a next level (AutoencoderKLHunyuanVideo15 fails the same way)"));
      break;
    }
    if (b.upsample_out_channels > 0) {
      if (std::string problem = UpsamplerProblem(b); !problem.empty()) {
        r.Fail(problem);
        break;
      }
    }
  }
  RETURN_IF_ERROR(r.status());
  // Structure keys checked against the structure.
  if (c.spatial_factor() != c.spatial_compression_ratio || c.temporal_factor() != c.temporal_compression_ratio) {
    r.Fail(absl::StrCat(c.block_out_channels.size(), " levels upsample ", c.spatial_factor(), "x in space and ",
                        c.temporal_factor(), "x in time, not the configured ", c.spatial_compression_ratio, "x and ",
                        c.temporal_compression_ratio, "x"));
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::hunyuanvideo15
