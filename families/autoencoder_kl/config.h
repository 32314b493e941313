#pragma once

// Constructor arguments of diffusers' AutoencoderKL that shape its decoder,
// with diffusers' defaults. SD 1.x/2.x, SDXL, SD3, FLUX.1 and Z-Image differ
// only in these values.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace vaedecode::families::autoencoder_kl {

struct AutoencoderKLConfig {
  int64_t latent_channels = 4;
  int64_t in_channels = 3;  // the encoder's image channels
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1;
  int64_t norm_num_groups = 32;
  std::string act_fn = "silu";
  bool mid_block_add_attention = true;
  bool use_quant_conv = true;                 // the encoder's 1x1 conv on the moments
  std::vector<std::string> down_block_types;  // the encoder's; checked when it is built
  bool use_post_quant_conv = true;
  double scaling_factor = 0.18215;
  std::optional<double> shift_factor;
  // SDXL-style per-channel statistics; when both are set, raw latents are
  // de-normalised as `z * std / scaling_factor + mean`.
  std::optional<std::vector<double>> latents_mean;
  std::optional<std::vector<double>> latents_std;
  bool force_upcast = true;
  int64_t sample_size = 32;  // pixels; diffusers' stock tile is this size
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;

  // 2^(levels-1): each up block but the last doubles height and width.
  int64_t spatial_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }

  // The diffusers config.json this configuration corresponds to.
  std::string ToJson() const;

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<AutoencoderKLConfig> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::autoencoder_kl
