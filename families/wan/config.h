#pragma once

// Constructor arguments of diffusers' AutoencoderKLWan that shape its decoder,
// with diffusers' defaults. Wan 2.1 and Wan 2.2 differ only in these values
// (2.2: `is_residual`, `decoder_base_dim`, `patch_size`); Qwen-Image's
// AutoencoderKLQwenImage is read into the same struct by families/qwenimage.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families {
class ConfigReader;
}

namespace vaedecode::families::wan {

// The decoder up-block classes of the Wan lineage. A family names the ones
// its checkpoints use (WanFamily).
enum class UpBlockType {
  kUpBlock,          // diffusers WanUpBlock / QwenImageUpBlock (Wan 2.1, Qwen-Image)
  kResidualUpBlock,  // diffusers WanResidualUpBlock (Wan 2.2, `is_residual`)
};

// The diffusers class name of an up-block type, for messages.
const char* UpBlockTypeName(UpBlockType type);

// A family built on the Wan blocks: its registry name, its diffusers class,
// the up-block classes its checkpoints are made of, and how its pipelines
// normalise an encoded latent for the denoiser.
struct WanFamily {
  std::string family;           // ModelInfo::family, e.g. "wan"
  std::string diffusers_class;  // config "_class_name", e.g. "AutoencoderKLWan"
  std::vector<UpBlockType> up_blocks;
  // Wan's I2V pipelines multiply by 1 / latents_std (a float32 reciprocal);
  // Qwen-Image's edit pipelines divide by latents_std.
  bool encode_divides_by_std = false;
  // Wan's pipelines de-normalise with z / (1 / latents_std) + latents_mean;
  // Qwen-Image-2.1's with z * latents_std + latents_mean.
  bool decode_multiplies_by_std = false;
};

// "wan": AutoencoderKLWan with WanUpBlock (2.1) or WanResidualUpBlock (2.2).
const WanFamily& WanFamilySpec();

struct WanConfig {
  std::string diffusers_class = "AutoencoderKLWan";
  int64_t base_dim = 96;
  std::optional<int64_t> decoder_base_dim;  // null: base_dim
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  // Read for completeness; diffusers' WanDecoder3d does not use it.
  std::vector<double> attn_scales;
  std::vector<bool> temperal_downsample = {false, true, true};  // diffusers' spelling
  std::vector<double> latents_mean;
  std::vector<double> latents_std;
  bool is_residual = false;
  int64_t in_channels = 3;
  // Channels of the decoder's conv_out: C·P·P with a patch size P.
  int64_t out_channels = 3;
  std::optional<int64_t> patch_size;  // null: no unpatchify
  // Qwen-Image-2.1 (AutoencoderKLQwenImage21): every causal conv is its
  // image specialisation, a 2-D conv on the single frame (checkpoint weights
  // [out, in, kh, kw]), so latents and images have exactly one frame.
  bool image_convs = false;
  // As configured; informational (the factors below follow from the structure).
  int64_t scale_factor_temporal = 4;
  int64_t scale_factor_spatial = 8;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;
  // Structure keys that disagree with the blocks (ModelInfo::config_warnings).
  std::vector<std::string> structure_warnings;

  // Wan 2.1's statistics: the diffusers defaults of both classes.
  static std::vector<double> DefaultLatentsMean();
  static std::vector<double> DefaultLatentsStd();

  UpBlockType up_block_type() const { return is_residual ? UpBlockType::kResidualUpBlock : UpBlockType::kUpBlock; }
  int64_t decoder_dim() const { return decoder_base_dim.value_or(base_dim); }
  int64_t patch() const { return patch_size.value_or(1); }
  int64_t levels() const { return static_cast<int64_t>(dim_mult.size()); }
  // Decoder widths: dim·[dim_mult[-1]] + dim·reversed(dim_mult) (diffusers `dims`).
  std::vector<int64_t> decoder_dims() const;
  // Encoder widths: base_dim·([1] + dim_mult) (diffusers WanEncoder3d `dims`).
  std::vector<int64_t> encoder_dims() const;
  // Whether the encoder's level i halves time: temperal_downsample[i], for
  // every level that downsamples at all (all but the last).
  bool down_level_downsamples_time(int64_t i) const;
  // Whether up block i doubles time: reversed temperal_downsample, and only
  // for blocks that upsample at all (every block but the last).
  bool up_block_upsamples_time(int64_t i) const;
  // 2^(temporal upsamplers): latent frame i > 0 decodes to this many frames.
  int64_t temporal_factor() const;
  // 2^(levels-1) spatial upsamplers, times the unpatchify's P.
  int64_t spatial_factor() const;
  // Image channels after the unpatchify (out_channels / P²).
  int64_t image_channels() const { return out_channels / (patch() * patch()); }

  // Records every structural problem in `r` (shared by the config parsers
  // of all families built on these blocks).
  void Check(ConfigReader& r) const;

  // Records in structure_warnings the set scale_factor_spatial/temporal keys
  // that disagree with the blocks (decoded as the blocks say).
  void NoteStructureKeys(const nlohmann::json& json);

  // Parses and validates an AutoencoderKLWan config.json (`source` names the
  // file in errors).
  static absl::StatusOr<WanConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::wan
