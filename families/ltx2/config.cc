#include "families/ltx2/config.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2 {
namespace {

// diffusers accepts `bool | tuple[bool, ...]` and broadcasts a bool to `n`.
std::vector<bool> BoolOrList(const nlohmann::json& json, ConfigReader& r, const char* key,
                             const std::vector<bool>& fallback, size_t n) {
  auto it = json.find(key);
  if (it != json.end() && it->is_boolean()) {
    r.Known({key});  // read here, not through the reader
    return std::vector<bool>(n, it->get<bool>());
  }
  return r.BoolList(key, fallback);
}

std::vector<int64_t> StrideOf(const std::string& type) {
  if (type == "spatial") return {1, 2, 2};
  if (type == "temporal") return {2, 1, 1};
  return {2, 2, 2};  // "spatiotemporal" or the encoder's "conv" (validated)
}

// The padding modes the row-sharded convs support, by diffusers' names.
std::optional<PaddingMode> PaddingModeNamed(const std::string& name) {
  if (name == "zeros") return PaddingMode::kZeros;
  if (name == "reflect") return PaddingMode::kReflect;
  if (name == "replicate") return PaddingMode::kReplicate;
  return std::nullopt;
}

template <typename T>
std::vector<T> Reversed(std::vector<T> v) {
  std::reverse(v.begin(), v.end());
  return v;
}

}  // namespace

int64_t LTX2Config::mid_channels() const { return decoder_block_out_channels.back(); }

int64_t LTX2Config::mid_layers() const { return decoder_layers_per_block.back(); }

std::vector<UpBlockSpec> LTX2Config::UpBlocks() const {
  const std::vector<int64_t> widths = Reversed(decoder_block_out_channels);
  const std::vector<bool> scaling = Reversed(decoder_spatio_temporal_scaling);
  const std::vector<int64_t> layers = Reversed(decoder_layers_per_block);
  const std::vector<bool> residual = Reversed(upsample_residual);
  const std::vector<int64_t> factor = Reversed(upsample_factor);
  std::vector<UpBlockSpec> blocks;
  int64_t output_channel = widths[0];
  for (size_t i = 0; i < widths.size(); ++i) {
    UpBlockSpec b;
    b.in_channels = output_channel / factor[i];
    output_channel = widths[i] / factor[i];
    b.out_channels = output_channel;
    b.num_layers = layers[i + 1];
    b.upsample = scaling[i];
    b.stride = StrideOf(upsample_type[i]);  // not reversed, as in diffusers
    b.upsample_residual = residual[i];
    b.upscale_factor = factor[i];
    blocks.push_back(b);
  }
  return blocks;
}

std::vector<DownBlockSpec> LTX2Config::DownBlocks() const {
  std::vector<DownBlockSpec> blocks;
  int64_t channels = latent_channels;  // conv_in widens to latent_channels
  for (size_t i = 0; i < block_out_channels.size(); ++i) {
    DownBlockSpec b;
    b.in_channels = channels;
    b.num_layers = layers_per_block[i];
    b.stride = {1, 1, 1};
    b.out_channels = channels;
    if (spatio_temporal_scaling[i]) {
      b.downsample_type = downsample_type[i];
      b.stride = StrideOf(b.downsample_type);
      if (b.downsample_type != "conv") b.out_channels = block_out_channels[i];
    }
    channels = b.out_channels;
    blocks.push_back(b);
  }
  return blocks;
}

int64_t LTX2Config::encoder_mid_channels() const {
  return block_out_channels.empty() ? latent_channels : block_out_channels.back();
}

absl::Status LTX2Config::CheckEncoder() const {
  const size_t n = block_out_channels.size();
  auto refuse = [](auto&&... why) {
    return absl::FailedPreconditionError(absl::StrCat("this AutoencoderKLLTX2Video cannot encode: ", why...));
  };
  if (in_channels < 1) return refuse("in_channels must be positive");
  if (layers_per_block.size() < std::max<size_t>(n, 1)) {
    return refuse("\"layers_per_block\" has ", layers_per_block.size(), " entries for ", n,
                  " down blocks and the mid block");
  }
  for (int64_t v : layers_per_block) {
    if (v < 0) return refuse("\"layers_per_block\" must not be negative");
  }
  for (const auto& [key, have] : {std::pair<const char*, size_t>{"down_block_types", down_block_types.size()},
                                  {"downsample_type", downsample_type.size()},
                                  {"spatio_temporal_scaling", spatio_temporal_scaling.size()}}) {
    if (have < n) return refuse("\"", key, "\" has ", have, " entries for ", n, " down blocks");
  }
  for (size_t i = 0; i < n; ++i) {
    if (down_block_types[i] != "LTX2VideoDownBlock3D") {
      return refuse("down block type \"", down_block_types[i], "\" is unknown (LTX2VideoDownBlock3D)");
    }
    const std::string& t = downsample_type[i];
    if (t != "conv" && t != "spatial" && t != "temporal" && t != "spatiotemporal") {
      return refuse("downsample_type \"", t, "\" is unknown (conv, spatial, temporal, spatiotemporal)");
    }
    if (block_out_channels[i] < 1) return refuse("\"block_out_channels\" must be positive");
  }
  if (!PaddingModeNamed(encoder_spatial_padding_name)) {
    return refuse("encoder_spatial_padding_mode \"", encoder_spatial_padding_name,
                  "\" is not supported (zeros, reflect or replicate)");
  }
  // Each block is built from its own arithmetic; the widths must chain as
  // the tensors do (diffusers fails at the first mismatching conv).
  const std::vector<DownBlockSpec> blocks = DownBlocks();
  for (size_t i = 0; i < n; ++i) {
    const DownBlockSpec& b = blocks[i];
    const int64_t cells = b.stride[0] * b.stride[1] * b.stride[2];
    const bool folds = !b.downsample_type.empty() && b.downsample_type != "conv";
    if (folds && (b.out_channels % cells != 0 || (b.in_channels * cells) % b.out_channels != 0)) {
      return refuse("down block ", i, " cannot fold ", b.in_channels, " channels into ", b.out_channels, " by ",
                    absl::StrJoin(b.stride, "x"));
    }
    if (b.out_channels != block_out_channels[i]) {
      return refuse("down block ", i, " ends with ", b.out_channels, " channels but the next layer takes ",
                    block_out_channels[i], " (a block without a folding downsampler keeps its width)");
    }
  }
  return absl::OkStatus();
}

int64_t LTX2Config::final_channels() const { return UpBlocks().back().out_channels; }

int64_t LTX2Config::spatial_factor() const {
  int64_t f = patch_size;
  for (const UpBlockSpec& b : UpBlocks()) {
    if (b.upsample) f *= b.stride[1];
  }
  return f;
}

int64_t LTX2Config::temporal_factor() const {
  int64_t f = patch_size_t;
  for (const UpBlockSpec& b : UpBlocks()) {
    if (b.upsample) f *= b.stride[0];
  }
  return f;
}

absl::StatusOr<LTX2Config> LTX2Config::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  LTX2Config c;
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.decoder_block_out_channels = r.IntList("decoder_block_out_channels", c.decoder_block_out_channels);
  c.decoder_layers_per_block = r.IntList("decoder_layers_per_block", c.decoder_layers_per_block);
  const size_t blocks = c.decoder_layers_per_block.size();
  const size_t ups = blocks == 0 ? 0 : blocks - 1;
  if (json.is_object()) {
    c.decoder_spatio_temporal_scaling =
        BoolOrList(json, r, "decoder_spatio_temporal_scaling", std::vector<bool>(ups, true), ups);
    c.decoder_inject_noise = BoolOrList(json, r, "decoder_inject_noise", std::vector<bool>(blocks, false), blocks);
    c.upsample_residual = BoolOrList(json, r, "upsample_residual", std::vector<bool>(ups, true), ups);
  }
  c.upsample_type = r.StringList("upsample_type", c.upsample_type);
  c.upsample_factor = r.IntList("upsample_factor", c.upsample_factor);
  c.timestep_conditioning = r.Bool("timestep_conditioning", c.timestep_conditioning);
  c.patch_size = r.Int("patch_size", c.patch_size);
  c.patch_size_t = r.Int("patch_size_t", c.patch_size_t);
  c.resnet_norm_eps = r.Double("resnet_norm_eps", c.resnet_norm_eps);
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  c.decoder_causal = r.Bool("decoder_causal", c.decoder_causal);
  c.spatial_padding_name = r.String("decoder_spatial_padding_mode", c.spatial_padding_name);

  c.in_channels = r.Int("in_channels", c.in_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.IntList("layers_per_block", c.layers_per_block);
  c.down_block_types = r.StringList("down_block_types", c.down_block_types);
  c.downsample_type = r.StringList("downsample_type", c.downsample_type);
  if (json.is_object()) {
    const size_t down = c.layers_per_block.empty() ? 0 : c.layers_per_block.size() - 1;
    c.spatio_temporal_scaling = BoolOrList(json, r, "spatio_temporal_scaling", std::vector<bool>(down, true), down);
  }
  c.encoder_causal = r.Bool("encoder_causal", c.encoder_causal);
  c.encoder_spatial_padding_name = r.String("encoder_spatial_padding_mode", c.encoder_spatial_padding_name);
  c.encoder_spatial_padding = PaddingModeNamed(c.encoder_spatial_padding_name).value_or(PaddingMode::kZeros);

  if (std::optional<PaddingMode> mode = PaddingModeNamed(c.spatial_padding_name)) {
    c.spatial_padding = *mode;
  } else {
    r.Fail(absl::StrCat("decoder_spatial_padding_mode \"", c.spatial_padding_name,
                        "\" is not supported (zeros, reflect or replicate)"));
  }
  const size_t levels = c.decoder_block_out_channels.size();
  if (levels == 0 || blocks != levels + 1) {
    r.Fail(absl::StrCat("\"decoder_layers_per_block\" needs one entry more than \"decoder_block_out_channels\" (",
                        blocks, " vs ", levels, ")"));
  }
  auto check_len = [&](const char* key, size_t have) {
    if (have != levels) r.Fail(absl::StrCat("\"", key, "\" has ", have, " entries, want ", levels));
  };
  check_len("decoder_spatio_temporal_scaling", c.decoder_spatio_temporal_scaling.size());
  check_len("upsample_type", c.upsample_type.size());
  check_len("upsample_residual", c.upsample_residual.size());
  check_len("upsample_factor", c.upsample_factor.size());
  if (c.decoder_inject_noise.size() != blocks) {
    r.Fail(absl::StrCat("\"decoder_inject_noise\" has ", c.decoder_inject_noise.size(), " entries, want ", blocks));
  }
  if (std::find(c.decoder_inject_noise.begin(), c.decoder_inject_noise.end(), true) != c.decoder_inject_noise.end()) {
    r.Fail(
        "decoder_inject_noise is not supported: such a decoder adds fresh torch.randn noise to every resnet on "
        "every call, so no decode is reproducible and row bands decoded on several ranks cannot form one "
        "decode's output");
  }
  for (const std::string& t : c.upsample_type) {
    if (t != "spatial" && t != "temporal" && t != "spatiotemporal") {
      r.Fail(absl::StrCat("upsample_type \"", t, "\" is not supported (spatial, temporal, spatiotemporal)"));
    }
  }
  if (c.patch_size_t != 1) {
    r.Fail(absl::StrCat("patch_size_t ", c.patch_size_t, " is not supported (LTX-2 uses 1)"));
  }
  if (c.latent_channels < 1 || c.out_channels < 1 || c.patch_size < 1) {
    r.Fail("latent_channels, out_channels and patch_size must be positive");
  }
  for (int64_t v : c.decoder_block_out_channels) {
    if (v < 1) r.Fail("\"decoder_block_out_channels\" must be positive");
  }
  for (int64_t v : c.decoder_layers_per_block) {
    if (v < 0) r.Fail("\"decoder_layers_per_block\" must not be negative");
  }
  for (int64_t v : c.upsample_factor) {
    if (v < 1) r.Fail("\"upsample_factor\" must be positive");
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  RETURN_IF_ERROR(r.status());

  // Widths the depth-to-space upsamplers must divide exactly, and a
  // timestep-conditioned conv_in resnet (diffusers hands it the raw timestep
  // instead of an embedding).
  int64_t channels = c.mid_channels();  // entering the next up block
  for (const UpBlockSpec& b : c.UpBlocks()) {
    // diffusers builds each block from its own arithmetic; the widths must
    // chain (conv_in, else the upsampler, else the resnets take the input).
    const int64_t takes = b.in_channels != b.out_channels ? b.in_channels
                          : b.upsample                    ? b.out_channels * b.upscale_factor
                                                          : b.out_channels;
    if (channels != takes) {
      r.Fail(
          absl::StrCat("decoder widths do not chain: an up block receives ", channels, " channels but takes ", takes));
    }
    channels = b.out_channels;
    const int64_t cells = b.stride[0] * b.stride[1] * b.stride[2];
    if (b.upsample && (b.out_channels * cells) % b.upscale_factor != 0) {
      r.Fail(absl::StrCat("an up block of width ", b.out_channels, " cannot upsample by ", absl::StrJoin(b.stride, "x"),
                          " with upsample_factor ", b.upscale_factor));
    }
    if (b.upsample && b.upsample_residual && (b.out_channels * b.upscale_factor) % cells != 0) {
      r.Fail(absl::StrCat("an up block of width ", b.out_channels * b.upscale_factor, " cannot fold its residual into ",
                          absl::StrJoin(b.stride, "x"), " cells"));
    }
    if (c.timestep_conditioning && b.in_channels != b.out_channels) {
      r.Fail(
          "timestep_conditioning with an up block that changes width is not supported (diffusers' conv_in "
          "resnet of such a block receives the raw timestep)");
    }
  }
  RETURN_IF_ERROR(r.status());
  // Structure keys against the structure: diffusers' decoder never reads
  // them (pipelines size latents from them), so a mismatch decodes as the
  // blocks say, with a warning naming what the structure implies.
  for (const auto& [key, actual] : {std::pair<const char*, int64_t>{"spatial_compression_ratio", c.spatial_factor()},
                                    {"temporal_compression_ratio", c.temporal_factor()}}) {
    if (json.contains(key) && !json[key].is_null() && r.Int(key, actual) != actual) {
      c.structure_warnings.push_back(absl::StrCat(key, " is ", r.Int(key, actual),
                                                  " but the decoder's blocks upsample ", actual,
                                                  "x; decoded as the blocks say (as diffusers does)"));
    }
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::ltx2
