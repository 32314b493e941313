#include "families/qwenimage/config.h"

#include <nlohmann/json.hpp>

#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage {

const wan::WanFamily& QwenImageFamilySpec() {
  static const wan::WanFamily* spec = new wan::WanFamily{
      "qwenimage", "AutoencoderKLQwenImage", {wan::UpBlockType::kUpBlock}, /*encode_divides_by_std=*/true};
  return *spec;
}

absl::StatusOr<wan::WanConfig> QwenImageConfigFromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  wan::WanConfig c;
  c.diffusers_class = "AutoencoderKLQwenImage";
  c.base_dim = r.Int("base_dim", c.base_dim);
  c.z_dim = r.Int("z_dim", c.z_dim);
  c.dim_mult = r.IntList("dim_mult", c.dim_mult);
  c.num_res_blocks = r.Int("num_res_blocks", c.num_res_blocks);
  c.attn_scales = r.OptionalDoubleList("attn_scales").value_or(std::vector<double>{});
  c.temperal_downsample = r.BoolList("temperal_downsample", c.temperal_downsample);
  r.Double("dropout", 0.0);  // inactive in eval
  c.in_channels = r.Int("input_channels", 3);
  c.out_channels = c.in_channels;
  c.latents_mean = r.OptionalDoubleList("latents_mean").value_or(wan::WanConfig::DefaultLatentsMean());
  c.latents_std = r.OptionalDoubleList("latents_std").value_or(wan::WanConfig::DefaultLatentsStd());
  // Not AutoencoderKLQwenImage arguments: Wan 2.1 structure, 2^levels spatial.
  c.is_residual = false;
  c.patch_size.reset();
  c.scale_factor_spatial = c.spatial_factor();
  c.scale_factor_temporal = c.temporal_factor();
  c.Check(r);
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::qwenimage
