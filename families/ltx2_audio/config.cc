#include "families/ltx2_audio/config.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2_audio {
namespace {

constexpr int64_t kGroupNormGroups = 32;
// Beyond these no checkpoint exists and the shape arithmetic would overflow.
constexpr int64_t kMaxLevels = 16;
constexpr int64_t kMaxStages = 16;
constexpr int64_t kMaxWidth = int64_t{1} << 24;

bool AllPositive(const std::vector<int64_t>& v) {
  return !v.empty() && std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 1; });
}

}  // namespace

int64_t LTX2AudioConfig::MelFrames(int64_t latent_frames) const {
  return std::max<int64_t>(kLatentDownsampleFactor * latent_frames - (kLatentDownsampleFactor - 1), 1);
}

absl::Status LTX2AudioConfig::CheckEncoder() const {
  if (in_channels < 1) return absl::InvalidArgumentError("\"in_channels\" must be positive to encode");
  if (!double_z) {
    // DiagonalGaussianDistribution would split the latent channels themselves into a mean and a log-variance.
    return absl::InvalidArgumentError("\"double_z\" false: the encoder makes no log-variance to sample with");
  }
  return absl::OkStatus();
}

absl::StatusOr<LTX2AudioConfig> LTX2AudioConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  LTX2AudioConfig c;
  c.base_channels = r.Int("base_channels", c.base_channels);
  c.output_channels = r.Int("output_channels", c.output_channels);
  c.ch_mult = r.IntList("ch_mult", c.ch_mult);
  c.num_res_blocks = r.Int("num_res_blocks", c.num_res_blocks);
  c.attn_resolutions = r.OptionalIntList("attn_resolutions").value_or(std::vector<int64_t>{});
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.resolution = r.Int("resolution", c.resolution);
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  const std::string norm = r.String("norm_type", "pixel");
  // diffusers rejects a null causality_axis too (its default is "height").
  const bool axis_null = json.contains("causality_axis") && json.at("causality_axis").is_null();
  const std::string axis = r.String("causality_axis", "height");
  r.Double("dropout", 0.0);  // training only
  c.mid_block_add_attention = r.Bool("mid_block_add_attention", c.mid_block_add_attention);
  c.sample_rate = r.Int("sample_rate", c.sample_rate);
  c.mel_hop_length = r.Int("mel_hop_length", c.mel_hop_length);
  r.Bool("is_causal", true);  // the patchifier's metadata; the causal axis decides
  const bool mel_null = json.contains("mel_bins") && json.at("mel_bins").is_null();
  c.mel_bins = mel_null ? 0 : r.Int("mel_bins", c.mel_bins);
  c.double_z = r.Bool("double_z", c.double_z);
  r.Known({"mel_bins", "causality_axis"});  // read above (null has a meaning)

  if (norm == "group") {
    c.group_norm = true;
  } else if (norm != "pixel") {
    r.Fail(absl::StrCat("\"norm_type\" must be \"group\" or \"pixel\", got \"", norm, "\""));
  }
  if (axis_null) {
    r.Fail("\"causality_axis\" is null; AutoencoderKLLTX2Audio takes none, width, height or width-compatibility");
  } else if (axis == "none") {
    c.causality_axis = CausalityAxis::kNone;
  } else if (axis == "width") {
    c.causality_axis = CausalityAxis::kWidth;
  } else if (axis == "height") {
    c.causality_axis = CausalityAxis::kHeight;
  } else if (axis == "width-compatibility") {
    c.causality_axis = CausalityAxis::kWidthCompatibility;
  } else {
    r.Fail(absl::StrCat("\"causality_axis\" must be none, width, height or width-compatibility, got \"", axis, "\""));
  }
  if (c.group_norm && c.causality_axis != CausalityAxis::kNone) {
    r.Fail(
        "norm_type \"group\" needs causality_axis \"none\" (diffusers: a causal ResnetBlock with GroupNorm is not "
        "supported)");
  }
  if (!AllPositive(c.ch_mult) || c.levels() > kMaxLevels) {
    r.Fail(absl::StrCat("\"ch_mult\" must be 1 to ", kMaxLevels, " positive integers"));
  }
  if (c.base_channels < 1 || c.output_channels < 1 || c.latent_channels < 1 || c.num_res_blocks < 0) {
    r.Fail("base_channels, output_channels and latent_channels must be positive, num_res_blocks not negative");
  }
  // Every block width: base_channels (the encoder's first) and base_channels · each multiplier.
  std::vector<int64_t> widths = {c.base_channels};
  for (int64_t m : c.ch_mult) {
    if (c.base_channels >= 1 && m >= 1 && m <= kMaxWidth / c.base_channels) widths.push_back(c.base_channels * m);
  }
  if (c.base_channels > kMaxWidth || widths.size() != c.ch_mult.size() + 1) {
    r.Fail(absl::StrCat("base_channels x ch_mult must stay within ", kMaxWidth, " channels"));
  }
  for (int64_t width : c.group_norm ? widths : std::vector<int64_t>{}) {
    if (width % kGroupNormGroups != 0) {
      r.Fail(absl::StrCat("norm_type \"group\": block width ", width, " is not a multiple of ", kGroupNormGroups,
                          " groups"));
      break;
    }
  }
  if (!mel_null && c.mel_bins < 1) r.Fail("\"mel_bins\" must be positive (or null)");
  if (c.sample_rate < 1 || c.mel_hop_length < 1) r.Fail("sample_rate and mel_hop_length must be positive");
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

int64_t LTX2VocoderConfig::hop() const {
  int64_t p = 1;
  for (int64_t f : upsample_factors) p *= f;
  return p;
}

int64_t LTX2VocoderConfig::Samples(int64_t mel_frames) const {
  int64_t length = mel_frames;
  for (size_t i = 0; i < upsample_factors.size(); ++i) {
    const int64_t f = upsample_factors[i], k = upsample_kernel_sizes[i];
    length = (length - 1) * f - 2 * ((k - f) / 2) + k;  // ConvTranspose1d(k, stride f, padding (k - f) // 2)
  }
  return length;
}

absl::StatusOr<LTX2VocoderConfig> LTX2VocoderConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  LTX2VocoderConfig c;
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.hidden_channels = r.Int("hidden_channels", c.hidden_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.upsample_kernel_sizes = r.IntList("upsample_kernel_sizes", c.upsample_kernel_sizes);
  c.upsample_factors = r.IntList("upsample_factors", c.upsample_factors);
  c.resnet_kernel_sizes = r.IntList("resnet_kernel_sizes", c.resnet_kernel_sizes);
  c.resnet_dilations = r.IntLists("resnet_dilations", c.resnet_dilations);
  c.act_fn = r.String("act_fn", c.act_fn);
  c.leaky_relu_negative_slope = r.Double("leaky_relu_negative_slope", c.leaky_relu_negative_slope);
  c.antialias = r.Bool("antialias", c.antialias);
  c.antialias_ratio = r.Int("antialias_ratio", c.antialias_ratio);
  c.antialias_kernel_size = r.Int("antialias_kernel_size", c.antialias_kernel_size);
  const bool final_null = json.contains("final_act_fn") && json.at("final_act_fn").is_null();
  c.final_act_fn = final_null ? "" : r.String("final_act_fn", c.final_act_fn);
  c.final_bias = r.Bool("final_bias", c.final_bias);
  c.output_sampling_rate = r.Int("output_sampling_rate", c.output_sampling_rate);
  r.Known({"final_act_fn"});
  RETURN_IF_ERROR(r.status());

  if (c.act_fn != "leaky_relu" && c.act_fn != "snake" && c.act_fn != "snakebeta") {
    r.Fail(absl::StrCat("\"act_fn\" must be snakebeta, snake or leaky_relu, got \"", c.act_fn, "\""));
  }
  if (c.act_fn == "leaky_relu" && c.antialias) {
    // diffusers' ResBlock then wraps each activation around the previous one
    // (acts2 nests acts1's module): a structure no checkpoint was trained with.
    r.Fail("\"antialias\" with act_fn leaky_relu builds nested activations in diffusers' ResBlock; not supported");
  }
  if (c.final_act_fn != "tanh" && c.final_act_fn != "clamp" && !c.final_act_fn.empty()) {
    r.Fail(absl::StrCat("\"final_act_fn\" must be tanh, clamp or null, got \"", c.final_act_fn, "\""));
  }
  if (!AllPositive(c.upsample_factors) || !AllPositive(c.upsample_kernel_sizes) ||
      !AllPositive(c.resnet_kernel_sizes) || static_cast<int64_t>(c.upsample_factors.size()) > kMaxStages) {
    r.Fail(absl::StrCat("the upsample factors and kernel sizes must be 1 to ", kMaxStages,
                        " positive integers, and resnet_kernel_sizes non-empty"));
  }
  if (c.upsample_kernel_sizes.size() != c.upsample_factors.size()) {
    r.Fail(absl::StrCat("\"upsample_kernel_sizes\" has ", c.upsample_kernel_sizes.size(), " entries for ",
                        c.upsample_factors.size(), " upsample_factors"));
  }
  if (c.resnet_dilations.size() != c.resnet_kernel_sizes.size()) {
    r.Fail(absl::StrCat("\"resnet_dilations\" has ", c.resnet_dilations.size(), " entries for ",
                        c.resnet_kernel_sizes.size(), " resnet_kernel_sizes"));
  }
  for (const std::vector<int64_t>& d : c.resnet_dilations) {
    if (!AllPositive(d)) r.Fail("every resnet_dilations entry must be a non-empty list of positive integers");
  }
  for (size_t i = 0; i < c.upsample_factors.size() && i < c.upsample_kernel_sizes.size(); ++i) {
    if (c.upsample_kernel_sizes[i] < c.upsample_factors[i]) {
      r.Fail(absl::StrCat("upsampler ", i, ": kernel ", c.upsample_kernel_sizes[i], " is shorter than its factor ",
                          c.upsample_factors[i], " (a negative padding)"));
    }
  }
  const int64_t halvings = static_cast<int64_t>(c.upsample_factors.size());
  if (c.in_channels < 1 || c.out_channels < 1 || c.hidden_channels < 1 || (c.hidden_channels >> halvings) < 1) {
    r.Fail(absl::StrCat("in_channels and out_channels must be positive, and hidden_channels ", c.hidden_channels,
                        " halvable by ", halvings, " upsamplers"));
  }
  if (c.snake() || c.antialias) {
    // UpSample1d crops x[..., left:-right]: an empty crop (right 0) leaves no signal.
    const int64_t k = c.antialias_kernel_size, ratio = c.antialias_ratio;
    if (ratio < 1 || k < 1 || (k / ratio - 1) * ratio + (k - ratio + 1) / 2 < 1 || k / ratio < 1) {
      r.Fail(absl::StrCat("antialias_kernel_size ", k, " with antialias_ratio ", ratio,
                          " leaves diffusers' UpSample1d no samples"));
    }
  }
  if (c.output_sampling_rate < 1) r.Fail("\"output_sampling_rate\" must be positive");
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::ltx2_audio
