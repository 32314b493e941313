#include "families/hunyuanimage3/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::hunyuanimage3 {

std::vector<LevelSpec> HunyuanImage3Config::DecoderLevels() const {
  const std::vector<int64_t> widths = decoder_widths();
  const int64_t levels = static_cast<int64_t>(widths.size());
  std::vector<LevelSpec> out;
  int64_t in = widths.front();
  for (int64_t i = 0; i < levels; ++i) {
    LevelSpec l;
    l.resnets = layers_per_block + 1;
    l.in_channels = in;
    l.out_channels = widths[i];
    in = widths[i];
    // The release: i < log2(ffactor_spatial) or i < log2(ffactor_temporal).
    const bool spatial = (int64_t{1} << i) < ffactor_spatial;
    l.temporal = (int64_t{1} << i) < ffactor_temporal;
    l.resample = spatial || l.temporal;
    if (l.resample) {
      l.resample_out = upsample_match_channel && i + 1 < levels ? widths[i + 1] : in;
      in = l.resample_out;
    }
    out.push_back(l);
  }
  return out;
}

std::vector<LevelSpec> HunyuanImage3Config::EncoderLevels() const {
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  std::vector<LevelSpec> out;
  int64_t in = block_out_channels.front();
  for (int64_t i = 0; i < levels; ++i) {
    LevelSpec l;
    l.resnets = layers_per_block;
    l.in_channels = in;
    l.out_channels = block_out_channels[i];
    if (layers_per_block > 0) in = block_out_channels[i];
    // The release: i < log2(ffactor_spatial), and for time also
    // i >= log2(ffactor_spatial // ffactor_temporal).
    l.resample = (int64_t{1} << i) < ffactor_spatial;
    l.temporal = l.resample && (int64_t{1} << i) >= ffactor_spatial / std::max<int64_t>(1, ffactor_temporal);
    if (l.resample) {
      l.resample_out = downsample_match_channel && i + 1 < levels ? block_out_channels[i + 1] : in;
      in = l.resample_out;
    }
    out.push_back(l);
  }
  return out;
}

int64_t HunyuanImage3Config::spatial_factor() const {
  int64_t f = 1;
  for (const LevelSpec& l : DecoderLevels()) f *= l.resample ? 2 : 1;
  return f;
}

int64_t HunyuanImage3Config::decoded_frames() const {
  int64_t f = 1;
  for (const LevelSpec& l : DecoderLevels()) f *= l.temporal ? 2 : 1;
  return f;
}

int64_t HunyuanImage3Config::encoder_width() const {
  int64_t width = block_out_channels.front();
  for (const LevelSpec& l : EncoderLevels()) {
    if (l.resnets > 0) width = l.out_channels;
    if (l.resample) width = l.resample_out;
  }
  return width;
}

int64_t HunyuanImage3Config::encoder_downsamplers() const {
  int64_t n = 0;
  for (const LevelSpec& l : EncoderLevels()) n += l.resample ? 1 : 0;
  return n;
}

absl::Status HunyuanImage3Config::CheckEncoder() const {
  const int64_t levels = static_cast<int64_t>(block_out_channels.size());
  const int64_t last = block_out_channels.back();
  if (last % (2 * latent_channels) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the encoder's last width ", last, " is not a multiple of 2 x ",
                                                   latent_channels, " latent channels (its output shortcut)"));
  }
  int64_t frames = ffactor_temporal;  // an image is expanded to this many frames
  const std::vector<LevelSpec> down = EncoderLevels();
  for (int64_t i = 0; i < levels; ++i) {
    const LevelSpec& l = down[i];
    if (!l.resample) continue;
    if (i == levels - 1) {
      return absl::InvalidArgumentError(absl::StrCat("ffactor_spatial ", ffactor_spatial, " needs more than the ",
                                                     levels, " levels of block_out_channels to downsample"));
    }
    const int64_t factor = l.temporal ? 8 : 4;
    const int64_t in = layers_per_block > 0 ? l.out_channels : l.in_channels;
    if (l.resample_out % factor != 0 || (factor * in) % l.resample_out != 0) {
      return absl::InvalidArgumentError(absl::StrCat("encoder level ", i, ": a DownsampleDCAE from ", in, " to ",
                                                     l.resample_out,
                                                     " channels has no whole channel groups for its shortcut"));
    }
    if (l.temporal) frames /= 2;
  }
  // The output shortcut folds the last level's channels into groups of
  // block_out_channels[-1] / (2 · latent_channels).
  const int64_t group = last / (2 * latent_channels);
  const int64_t width = encoder_width();
  if (width % group != 0 || width / group != 2 * latent_channels) {
    return absl::InvalidArgumentError(absl::StrCat("the encoder ends ", width,
                                                   " channels wide, which its output "
                                                   "shortcut cannot fold to 2 x ",
                                                   latent_channels, " in groups of ", group));
  }
  if (frames != 1) {
    return absl::InvalidArgumentError(absl::StrCat("an image expanded to ffactor_temporal (", ffactor_temporal,
                                                   ") frames would encode to ", frames,
                                                   " latent frames, not one (the levels halve time less often)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HunyuanImage3Config> HunyuanImage3Config::FromJson(const nlohmann::json& json,
                                                                  const std::string& source) {
  ConfigReader r(json, source);
  HunyuanImage3Config c;
  for (const char* key : {"in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
                          "ffactor_spatial", "ffactor_temporal", "sample_size", "sample_tsize"}) {
    if (!json.contains(key) || json[key].is_null()) {
      r.Fail(absl::StrCat("\"", key, "\" is required (AutoencoderKLConv3D has no default for it)"));
    }
  }
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.ffactor_spatial = r.Int("ffactor_spatial", c.ffactor_spatial);
  c.ffactor_temporal = r.Int("ffactor_temporal", c.ffactor_temporal);
  c.sample_size = r.Int("sample_size", c.sample_size);
  r.Int("sample_tsize", 0);  // temporal tiles of clips: images have none
  // Its pipelines divide by it; a config without one decodes raw latents unscaled.
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  c.shift_factor = r.OptionalDouble("shift_factor");
  c.downsample_match_channel = r.Bool("downsample_match_channel", c.downsample_match_channel);
  c.upsample_match_channel = r.Bool("upsample_match_channel", c.upsample_match_channel);
  // Which halves the release builds; a folder with both loads either.
  r.Bool("only_encoder", false);
  r.Bool("only_decoder", false);
  RETURN_IF_ERROR(r.status());

  if (c.block_out_channels.empty()) r.Fail("\"block_out_channels\" must not be empty");
  if (c.in_channels < 1 || c.out_channels < 1 || c.latent_channels < 1 || c.layers_per_block < 0 || c.sample_size < 1) {
    r.Fail(
        "in_channels, out_channels, latent_channels and sample_size must be positive, layers_per_block "
        "non-negative");
  }
  for (const auto& [name, f] : {std::pair<const char*, int64_t>{"ffactor_spatial", c.ffactor_spatial},
                                {"ffactor_temporal", c.ffactor_temporal}}) {
    if (f < 1 || (f & (f - 1)) != 0) r.Fail(absl::StrCat(name, " ", f, " is not a power of 2"));
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  RETURN_IF_ERROR(r.status());
  for (int64_t width : c.block_out_channels) {
    if (width < 1 || width % kNormGroups != 0) {
      r.Fail(absl::StrCat("block width ", width, " is not a positive multiple of 32 (the GroupNorm groups)"));
    }
  }
  const int64_t first = c.decoder_widths().front();
  if (first % c.latent_channels != 0) {
    r.Fail(absl::StrCat("the decoder's first width ", first, " (block_out_channels[-1]) is not a multiple of ",
                        c.latent_channels, " latent channels (conv_in's repeat shortcut)"));
  }
  RETURN_IF_ERROR(r.status());
  const std::vector<LevelSpec> up = c.DecoderLevels();
  for (size_t i = 0; i < up.size(); ++i) {
    const LevelSpec& l = up[i];
    if (!l.resample) continue;
    if (i + 1 == up.size()) {
      r.Fail(absl::StrCat("ffactor_spatial ", c.ffactor_spatial, " / ffactor_temporal ", c.ffactor_temporal,
                          " need more than the ", up.size(), " levels of block_out_channels to upsample"));
      break;
    }
    const int64_t factor = l.temporal ? 8 : 4;
    if ((factor * l.resample_out) % l.out_channels != 0) {
      r.Fail(absl::StrCat("decoder level ", i, ": an UpsampleDCAE from ", l.out_channels, " to ", l.resample_out,
                          " channels has no whole channel repeat for its shortcut"));
      break;
    }
  }
  RETURN_IF_ERROR(r.status());
  // A temporal-only level's UpsampleDCAE still doubles H and W: the release
  // decodes such a model as its levels say, and so do we, with a warning.
  if (c.spatial_factor() != c.ffactor_spatial) {
    c.structure_warnings.push_back(absl::StrCat("ffactor_spatial is ", c.ffactor_spatial, " but the levels upsample ",
                                                c.spatial_factor(),
                                                "x (every UpsampleDCAE doubles H and W); decoded "
                                                "as the levels say (as the release does)"));
  }
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::hunyuanimage3
