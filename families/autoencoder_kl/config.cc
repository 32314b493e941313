#include "families/autoencoder_kl/config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::autoencoder_kl {

std::string AutoencoderKLConfig::ToJson() const {
  nlohmann::json j = {
      {"_class_name", "AutoencoderKL"},
      {"latent_channels", latent_channels},
      {"in_channels", in_channels},
      {"out_channels", out_channels},
      {"block_out_channels", block_out_channels},
      {"up_block_types", std::vector<std::string>(block_out_channels.size(), "UpDecoderBlock2D")},
      {"layers_per_block", layers_per_block},
      {"norm_num_groups", norm_num_groups},
      {"act_fn", act_fn},
      {"mid_block_add_attention", mid_block_add_attention},
      {"down_block_types", std::vector<std::string>(block_out_channels.size(), "DownEncoderBlock2D")},
      {"use_quant_conv", use_quant_conv},
      {"use_post_quant_conv", use_post_quant_conv},
      {"scaling_factor", scaling_factor},
      {"shift_factor", shift_factor ? nlohmann::json(*shift_factor) : nlohmann::json(nullptr)},
      {"latents_mean", latents_mean ? nlohmann::json(*latents_mean) : nlohmann::json(nullptr)},
      {"latents_std", latents_std ? nlohmann::json(*latents_std) : nlohmann::json(nullptr)},
      {"force_upcast", force_upcast},
      {"sample_size", sample_size},
  };
  return j.dump(2);
}

absl::StatusOr<AutoencoderKLConfig> AutoencoderKLConfig::FromJson(const nlohmann::json& json,
                                                                  const std::string& source) {
  ConfigReader r(json, source);
  AutoencoderKLConfig c;
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.norm_num_groups = r.Int("norm_num_groups", c.norm_num_groups);
  c.act_fn = r.String("act_fn", c.act_fn);
  c.mid_block_add_attention = r.Bool("mid_block_add_attention", c.mid_block_add_attention);
  c.use_quant_conv = r.Bool("use_quant_conv", c.use_quant_conv);
  c.use_post_quant_conv = r.Bool("use_post_quant_conv", c.use_post_quant_conv);
  c.scaling_factor = r.Double("scaling_factor", c.scaling_factor);
  c.shift_factor = r.OptionalDouble("shift_factor");
  c.latents_mean = r.OptionalDoubleList("latents_mean");
  c.latents_std = r.OptionalDoubleList("latents_std");
  c.force_upcast = r.Bool("force_upcast", c.force_upcast);
  c.sample_size = r.Int("sample_size", c.sample_size);
  const std::vector<std::string> up_blocks =
      r.StringList("up_block_types", std::vector<std::string>(c.block_out_channels.size(), "UpDecoderBlock2D"));

  const std::vector<std::string> down_blocks =
      r.StringList("down_block_types", std::vector<std::string>(c.block_out_channels.size(), "DownEncoderBlock2D"));
  if (c.block_out_channels.empty()) r.Fail("\"block_out_channels\" must not be empty");
  // The encoder's blocks are its to check (a decode never builds them).
  c.down_block_types = down_blocks;
  if (c.in_channels < 1) r.Fail("\"in_channels\" must be positive");
  if (up_blocks.size() != c.block_out_channels.size()) {
    r.Fail(absl::StrCat("\"up_block_types\" has ", up_blocks.size(), " entries but \"block_out_channels\" has ",
                        c.block_out_channels.size()));
  }
  for (const std::string& t : up_blocks) {
    if (t != "UpDecoderBlock2D")
      r.Fail(absl::StrCat("up block type \"", t, "\" is not supported (only UpDecoderBlock2D)"));
  }
  r.RequireSilu(c.act_fn);
  if (c.latent_channels < 1 || c.out_channels < 1 || c.layers_per_block < 0 || c.norm_num_groups < 1) {
    r.Fail("latent_channels, out_channels and norm_num_groups must be positive, layers_per_block non-negative");
  }
  for (int64_t width : c.block_out_channels) {
    if (width < 1 || (c.norm_num_groups > 0 && width % c.norm_num_groups != 0)) {
      r.Fail(absl::StrCat("block width ", width, " is not a positive multiple of norm_num_groups ", c.norm_num_groups));
    }
  }
  if (c.scaling_factor == 0) r.Fail("\"scaling_factor\" must not be 0");
  if (c.latents_mean.has_value() != c.latents_std.has_value()) {
    // diffusers pipelines use the statistics only when both are present.
    c.latents_mean.reset();
    c.latents_std.reset();
  }
  if (c.latents_mean && (static_cast<int64_t>(c.latents_mean->size()) != c.latent_channels ||
                         static_cast<int64_t>(c.latents_std->size()) != c.latent_channels)) {
    r.Fail(
        absl::StrCat("\"latents_mean\"/\"latents_std\" must have latent_channels (", c.latent_channels, ") entries"));
  }
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::autoencoder_kl
