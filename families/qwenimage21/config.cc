#include "families/qwenimage21/config.h"

#include <nlohmann/json.hpp>

#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage21 {
namespace {

// diffusers' defaults (autoencoder_kl_qwenimage21.py): Qwen-Image-2.1's own statistics.
std::vector<double> DefaultLatentsMean() {
  return {0.5126,  0.7721,  -0.0631, 1.3506,  -0.7855, -2.1025, -0.3458, 1.3722,  1.8873,  -1.7177, -0.651,
          0.2732,  0.7562,  -0.6163, -1.0277, 3.8363,  2.021,   0.0472,  0.932,   2.0087,  2.4954,  -0.1391,
          -1.4249, 1.8464,  -0.5236, 1.2826,  3.7046,  -1.3035, 2.7286,  -1.4518, -1.9036, -1.9955, -0.0342,
          -1.0265, -0.7636, 3.0555,  0.0746,  -3.0751, -0.1076, 1.7376,  -1.0914, -1.9435, -0.2784, -1.368,
          0.4809,  -0.4433, 0.3764,  0.5729,  -2.0595, 1.096,   -1.326,  -2.0211, -5.0179, 0.5275,  4.0162,
          1.8505,  0.3026,  1.9373,  1.4937,  0.2632,  0.5547,  -1.7121, -0.1562, 0.0304};
}

std::vector<double> DefaultLatentsStd() {
  return {3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.791,  3.0785, 3.65,   3.9308, 3.0904, 2.8778,
          3.7675, 3.732,  5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489, 3.4896, 3.8513,
          3.9323, 3.4719, 3.7498, 4.283,  3.5694, 4.2467, 3.9037, 3.2947, 5.077,  3.5075, 3.27,   3.4767, 2.8063,
          5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875, 3.9624, 4.0168, 3.5643, 4.055,
          5.5614, 4.2963, 4.408,  3.4959, 3.8747, 3.7608, 3.5735, 3.149,  3.7662, 3.6746, 3.4563, 3.8161};
}

}  // namespace

const wan::WanFamily& QwenImage21FamilySpec() {
  static const wan::WanFamily* spec = new wan::WanFamily{"qwenimage21",
                                                         "AutoencoderKLQwenImage21",
                                                         {wan::UpBlockType::kResidualUpBlock},
                                                         /*encode_divides_by_std=*/true,
                                                         /*decode_multiplies_by_std=*/true};
  return *spec;
}

absl::StatusOr<wan::WanConfig> QwenImage21ConfigFromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  wan::WanConfig c;
  c.diffusers_class = "AutoencoderKLQwenImage21";
  c.image_convs = true;
  c.base_dim = r.Int("base_dim", 96);
  // diffusers' default is 144; an explicit null means base_dim.
  if (!json.contains("decoder_base_dim")) {
    c.decoder_base_dim = 144;
  } else if (r.OptionalDouble("decoder_base_dim")) {
    c.decoder_base_dim = r.Int("decoder_base_dim", c.base_dim);
  }
  c.z_dim = r.Int("z_dim", 64);
  c.dim_mult = r.IntList("dim_mult", {1, 2, 4, 8, 8});
  c.num_res_blocks = r.Int("num_res_blocks", 2);
  c.attn_scales = r.OptionalDoubleList("attn_scales").value_or(std::vector<double>{});
  c.temperal_downsample = r.BoolList("temperal_downsample", {false, true, true, true});
  r.Double("dropout", 0.0);  // inactive in eval
  c.latents_mean = r.OptionalDoubleList("latents_mean").value_or(DefaultLatentsMean());
  c.latents_std = r.OptionalDoubleList("latents_std").value_or(DefaultLatentsStd());
  c.is_residual = r.Bool("is_residual", true);
  c.in_channels = r.Int("in_channels", 4);
  c.out_channels = r.Int("out_channels", 4);
  if (r.OptionalDouble("patch_size")) c.patch_size = r.Int("patch_size", 1);
  // Metadata a pipeline reads; the blocks are the structure (T = 1 here, so
  // the temporal one describes nothing this decoder does).
  c.scale_factor_temporal = r.Int("scale_factor_temporal", 8);
  c.scale_factor_spatial = r.Int("scale_factor_spatial", 16);
  c.Check(r);
  RETURN_IF_ERROR(r.status());
  c.NoteStructureKeys(json);
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::qwenimage21
