#include "families/wan/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::wan {

const char* UpBlockTypeName(UpBlockType type) {
  switch (type) {
    case UpBlockType::kUpBlock:
      return "WanUpBlock";
    case UpBlockType::kResidualUpBlock:
      return "WanResidualUpBlock";
  }
  return "?";
}

const WanFamily& WanFamilySpec() {
  static const WanFamily* spec =
      new WanFamily{"wan", "AutoencoderKLWan", {UpBlockType::kUpBlock, UpBlockType::kResidualUpBlock}};
  return *spec;
}

std::vector<double> WanConfig::DefaultLatentsMean() {
  return {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
          0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
}

std::vector<double> WanConfig::DefaultLatentsStd() {
  return {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
          3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
}

std::vector<int64_t> WanConfig::decoder_dims() const {
  std::vector<int64_t> dims;
  if (dim_mult.empty()) return dims;
  dims.push_back(decoder_dim() * dim_mult.back());
  for (auto it = dim_mult.rbegin(); it != dim_mult.rend(); ++it) dims.push_back(decoder_dim() * *it);
  return dims;
}

std::vector<int64_t> WanConfig::encoder_dims() const {
  std::vector<int64_t> dims = {base_dim};
  for (int64_t m : dim_mult) dims.push_back(base_dim * m);
  return dims;
}

bool WanConfig::down_level_downsamples_time(int64_t i) const {
  const int64_t n = static_cast<int64_t>(temperal_downsample.size());
  return i >= 0 && i < levels() - 1 && i < n && temperal_downsample[i];
}

bool WanConfig::up_block_upsamples_time(int64_t i) const {
  const int64_t n = static_cast<int64_t>(temperal_downsample.size());
  if (i < 0 || i >= levels() - 1 || i >= n) return false;
  return temperal_downsample[n - 1 - i];  // temperal_upsample = temperal_downsample[::-1]
}

int64_t WanConfig::temporal_factor() const {
  int64_t factor = 1;
  for (int64_t i = 0; i + 1 < levels(); ++i) {
    if (up_block_upsamples_time(i)) factor *= 2;
  }
  return factor;
}

int64_t WanConfig::spatial_factor() const { return (levels() > 0 ? int64_t{1} << (levels() - 1) : 1) * patch(); }

void WanConfig::Check(ConfigReader& r) const {
  if (dim_mult.empty()) r.Fail("\"dim_mult\" must not be empty");
  for (int64_t m : dim_mult) {
    if (m < 1) r.Fail(absl::StrCat("\"dim_mult\" entries must be positive, got ", m));
  }
  if (base_dim < 1 || decoder_dim() < 1 || z_dim < 1 || num_res_blocks < 0 || in_channels < 1 || out_channels < 1) {
    r.Fail("base_dim, decoder_base_dim, z_dim and the channel counts must be positive, num_res_blocks non-negative");
  }
  if (static_cast<int64_t>(temperal_downsample.size()) != levels() - 1) {
    r.Fail(absl::StrCat("\"temperal_downsample\" has ", temperal_downsample.size(), " entries; dim_mult's ", levels(),
                        " levels need ", levels() - 1));
  }
  if (patch_size && *patch_size < 1) r.Fail(absl::StrCat("\"patch_size\" must be positive, got ", *patch_size));
  if (patch() > 0 && out_channels % (patch() * patch()) != 0) {
    r.Fail(absl::StrCat("out_channels ", out_channels, " is not a multiple of patch_size² (", patch() * patch(), ")"));
  }
  if (static_cast<int64_t>(latents_mean.size()) != z_dim || static_cast<int64_t>(latents_std.size()) != z_dim) {
    r.Fail(absl::StrCat("\"latents_mean\"/\"latents_std\" must have z_dim (", z_dim, ") entries, got ",
                        latents_mean.size(), "/", latents_std.size()));
  }
  for (double s : latents_std) {
    if (s == 0) r.Fail("\"latents_std\" entries must not be 0");
  }
  const std::vector<int64_t> dims = decoder_dims();
  if (!is_residual) {
    // Wan 2.1 / Qwen: each spatial upsampler halves the width.
    for (size_t i = 1; i < dims.size(); ++i) {
      if (dims[i] / 2 < 1) r.Fail(absl::StrCat("decoder width ", dims[i], " cannot be halved by an upsampler"));
    }
  } else {
    // WanResidualUpBlock's DupUp3D repeats channels: out·factor must divide by in.
    for (int64_t i = 0; i + 1 < levels() && i + 1 < static_cast<int64_t>(dims.size()); ++i) {
      const int64_t factor = (up_block_upsamples_time(i) ? 2 : 1) * 4;
      if (dims[i] > 0 && (dims[i + 1] * factor) % dims[i] != 0) {
        r.Fail(absl::StrCat("up block ", i, ": width ", dims[i + 1], "·", factor, " is not a multiple of ", dims[i],
                            " (DupUp3D shortcut)"));
      }
    }
  }
}

absl::StatusOr<WanConfig> WanConfig::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  WanConfig c;
  c.diffusers_class = r.String("_class_name", c.diffusers_class);
  c.base_dim = r.Int("base_dim", c.base_dim);
  if (r.OptionalDouble("decoder_base_dim")) c.decoder_base_dim = r.Int("decoder_base_dim", c.base_dim);
  c.z_dim = r.Int("z_dim", c.z_dim);
  c.dim_mult = r.IntList("dim_mult", c.dim_mult);
  c.num_res_blocks = r.Int("num_res_blocks", c.num_res_blocks);
  c.attn_scales = r.OptionalDoubleList("attn_scales").value_or(std::vector<double>{});
  c.temperal_downsample = r.BoolList("temperal_downsample", c.temperal_downsample);
  r.Double("dropout", 0.0);  // inactive in eval
  c.latents_mean = r.OptionalDoubleList("latents_mean").value_or(DefaultLatentsMean());
  c.latents_std = r.OptionalDoubleList("latents_std").value_or(DefaultLatentsStd());
  c.is_residual = r.Bool("is_residual", c.is_residual);
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  if (r.OptionalDouble("patch_size")) c.patch_size = r.Int("patch_size", 1);
  c.scale_factor_temporal = r.Int("scale_factor_temporal", c.scale_factor_temporal);
  c.scale_factor_spatial = r.Int("scale_factor_spatial", c.scale_factor_spatial);
  c.Check(r);
  RETURN_IF_ERROR(r.status());
  c.NoteStructureKeys(json);
  c.unread_keys = r.UnreadKeys();
  return c;
}

void WanConfig::NoteStructureKeys(const nlohmann::json& json) {
  // diffusers' decoder never reads them (pipelines size latents from them),
  // so a mismatch decodes as the blocks say, with a warning naming what the
  // structure implies.
  const bool spatial_set = json.contains("scale_factor_spatial") && !json["scale_factor_spatial"].is_null();
  const bool temporal_set = json.contains("scale_factor_temporal") && !json["scale_factor_temporal"].is_null();
  if (spatial_set && scale_factor_spatial != spatial_factor()) {
    structure_warnings.push_back(absl::StrCat("scale_factor_spatial is ", scale_factor_spatial,
                                              " but the decoder's blocks upsample ", spatial_factor(),
                                              "x in space; decoded as the blocks say (as diffusers does)"));
  }
  // An image-only model has no time to upsample.
  if (temporal_set && !image_convs && scale_factor_temporal != temporal_factor()) {
    structure_warnings.push_back(absl::StrCat("scale_factor_temporal is ", scale_factor_temporal,
                                              " but the decoder's blocks upsample ", temporal_factor(),
                                              "x in time; decoded as the blocks say (as diffusers does)"));
  }
}

}  // namespace vaedecode::families::wan
