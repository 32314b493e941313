#pragma once

// Constructor arguments of diffusers' AutoencoderKLMiniMaxH3 that shape its
// decode path (post_quant_conv, then a ViT decoder per temporal window) and
// its encode path (a causal 3-D CNN per clip_length-frame clip, then
// quant_conv), with diffusers' defaults, and the window geometry its _decode
// derives from clip_length and token_drop.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "families/layer_ops.h"
#include "families/pixel_convention.h"

namespace vaedecode::families::minimax_h3 {

// How _decode covers T latent frames: pad the latent with copies of its last
// frame, decode `windows` overlapping windows, cross-fade them, cut the
// frames that came from the pad copies.
struct WindowPlan {
  int64_t pad_frames = 0;   // latent frames appended (copies of the last)
  int64_t windows = 0;      // decoder calls; 0: diffusers cannot decode T
  int64_t trim_frames = 0;  // output frames cut at the end (from the pad copies)
  int64_t output_frames = 0;
};

// MiniMaxH3ModularPipeline's pixel convention (pixel_mean / pixel_std:
// ImageNet's) for RGB; the [-1, 1] convention for other channel counts.
PixelConvention PipelinePixels(int64_t channels);

struct MiniMaxH3Config {
  int64_t latent_channels = 24;
  int64_t out_channels = 3;
  std::vector<int64_t> spatial_downsample_factors = {2, 2, 2, 2, 1, 1};
  std::vector<int64_t> temporal_downsample_factors = {1, 2, 2, 1, 1, 1};
  int64_t decoder_num_layers = 36;
  int64_t decoder_num_attention_heads = 32;
  int64_t decoder_attention_head_dim = 64;
  int64_t decoder_num_register_tokens = 4;
  double decoder_ffn_mult = 4;
  double decoder_rope_theta = 100.0;
  double decoder_rope_dim_ratio = 0.75;
  double decoder_norm_eps = 1e-5;
  int64_t clip_length = 17;
  int64_t token_drop = 3;
  std::vector<double> latents_mean = std::vector<double>(24, 0.0);
  std::vector<double> latents_std = std::vector<double>(24, 1.0);
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;
  // The encoder side (read always, checked by CheckEncoder when it is built).
  int64_t in_channels = 3;
  std::vector<int64_t> block_out_channels = {128, 256, 256, 512, 512, 1024};
  int64_t layers_per_block = 2;
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-6;
  std::string spatial_padding_mode = "reflect";         // torch F.pad's name
  PaddingMode encoder_padding = PaddingMode::kReflect;  // when the name is supported
  // OK when diffusers builds and runs this encoder; why not otherwise.
  absl::Status CheckEncoder() const;

  int64_t patch_size() const;    // prod(spatial_downsample_factors): pixels per latent row
  int64_t patch_size_t() const;  // prod(temporal_downsample_factors): frames per latent frame
  int64_t dim() const { return decoder_num_attention_heads * decoder_attention_head_dim; }
  int64_t ffn_inner_dim() const { return static_cast<int64_t>(static_cast<double>(dim()) * decoder_ffn_mult); }
  // Channels of each head that RoPE rotates: int(head_dim · rope_dim_ratio).
  int64_t rope_dim() const {
    return static_cast<int64_t>(static_cast<double>(decoder_attention_head_dim) * decoder_rope_dim_ratio);
  }
  // The window geometry of AutoencoderKLMiniMaxH3.__init__.
  int64_t frame_pre_padding() const;  // (-clip_length) mod patch_t
  int64_t tokens_chunk_size() const;  // ceil(clip_length / patch_t): latent frames per window step
  int64_t token_overlap() const;      // (-token_drop) mod tokens_chunk_size
  int64_t frame_overlap() const;      // cross-faded frames between windows
  int64_t window_latent_frames() const { return tokens_chunk_size() + token_overlap(); }

  // _decode's windows for `latent_frames` latent frames.
  WindowPlan Windows(int64_t latent_frames) const;

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<MiniMaxH3Config> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::minimax_h3
