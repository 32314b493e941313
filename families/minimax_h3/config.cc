#include "families/minimax_h3/config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/config_reader.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::minimax_h3 {
namespace {

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

// Bounds far beyond any release (patches of 32 and 4, 128 channels, clips of
// 17 frames) that keep the window arithmetic in range: the products and
// modulos below would overflow or divide by zero past them.
constexpr int64_t kMaxPatch = 1024;
constexpr int64_t kMaxChannels = 1 << 16;
constexpr int64_t kMaxClipLength = 1 << 16;

// Python's a % b for b > 0 (never negative).
int64_t PyMod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

// Frames of python's t[start : start + length] on a `size`-frame tensor.
int64_t SliceLength(int64_t size, int64_t start, int64_t length) {
  return std::max<int64_t>(0, std::min(size, start + length) - std::min(size, start));
}

}  // namespace

int64_t MiniMaxH3Config::patch_size() const { return Product(spatial_downsample_factors); }
int64_t MiniMaxH3Config::patch_size_t() const { return Product(temporal_downsample_factors); }
int64_t MiniMaxH3Config::frame_pre_padding() const { return PyMod(-clip_length, patch_size_t()); }
int64_t MiniMaxH3Config::tokens_chunk_size() const { return (clip_length + patch_size_t() - 1) / patch_size_t(); }
int64_t MiniMaxH3Config::token_overlap() const { return PyMod(-token_drop, tokens_chunk_size()); }
int64_t MiniMaxH3Config::frame_overlap() const {
  return std::max<int64_t>(token_overlap() * patch_size_t() - frame_pre_padding(), 0);
}

WindowPlan MiniMaxH3Config::Windows(int64_t latent_frames) const {
  // AutoencoderKLMiniMaxH3._decode on frame counts only.
  WindowPlan p;
  const int64_t chunk = tokens_chunk_size();
  const int64_t chunk_frames = chunk * patch_size_t();
  const int64_t num_tokens = latent_frames + token_drop;
  p.pad_frames = PyMod(-num_tokens, chunk);
  p.windows = (num_tokens + p.pad_frames) / chunk - (token_drop > 0 ? 1 : 0);
  if (p.windows <= 0) {
    p.windows = 0;
    return p;
  }
  const int64_t padded = latent_frames + p.pad_frames;
  int64_t frames = 0;
  int64_t tail = 0;
  for (int64_t i = 0; i < p.windows; ++i) {
    const int64_t clip_frames = SliceLength(padded, i * chunk, window_latent_frames()) * patch_size_t();
    for (int64_t j = 0; j <= (token_drop > 0 ? 1 : 0); ++j) {
      const int64_t part =
          SliceLength(SliceLength(clip_frames, j * chunk_frames, chunk_frames), frame_pre_padding(), chunk_frames);
      if (j == 0) {
        frames += part;  // a cross-fade keeps the count
      } else {
        tail = part;
      }
    }
  }
  frames += tail;
  // Each pad latent frame made patch_t frames, but one whose latent index
  // starts a chunk only clip_length mod patch_t.
  const int64_t intra_tail = clip_length % patch_size_t();
  for (int64_t k = 0; k < p.pad_frames; ++k) {
    p.trim_frames += intra_tail != 0 && (latent_frames + k) % chunk == 0 ? intra_tail : patch_size_t();
  }
  p.output_frames = std::max<int64_t>(0, frames - p.trim_frames);
  return p;
}

PixelConvention PipelinePixels(int64_t channels) {
  if (channels != 3) return {};
  return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}};
}

absl::Status MiniMaxH3Config::CheckEncoder() const {
  auto refuse = [](auto&&... why) {
    return absl::FailedPreconditionError(absl::StrCat("this AutoencoderKLMiniMaxH3 cannot encode: ", why...));
  };
  const size_t n = block_out_channels.size();
  if (n == 0) return refuse("\"block_out_channels\" is empty");
  if (spatial_downsample_factors.size() < n || temporal_downsample_factors.size() < n) {
    return refuse("the downsample factor lists have fewer entries than the ", n, " levels");
  }
  if (in_channels < 1 || layers_per_block < 0 || norm_num_groups < 1) {
    return refuse("in_channels and norm_num_groups must be positive, layers_per_block non-negative");
  }
  for (int64_t width : block_out_channels) {
    if (width < 1 || width > kMaxChannels || width % norm_num_groups != 0) {
      return refuse("block width ", width, " is not a positive multiple of norm_num_groups (", norm_num_groups, ")");
    }
  }
  if (spatial_padding_mode != "reflect" && spatial_padding_mode != "replicate" && spatial_padding_mode != "constant") {
    return refuse("spatial_padding_mode \"", spatial_padding_mode,
                  "\" is not supported (reflect, replicate or constant)");
  }
  return absl::OkStatus();
}

absl::StatusOr<MiniMaxH3Config> MiniMaxH3Config::FromJson(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source);
  MiniMaxH3Config c;
  c.latent_channels = r.Int("latent_channels", c.latent_channels);
  c.out_channels = r.Int("out_channels", c.out_channels);
  c.spatial_downsample_factors = r.IntList("spatial_downsample_factors", c.spatial_downsample_factors);
  c.temporal_downsample_factors = r.IntList("temporal_downsample_factors", c.temporal_downsample_factors);
  c.decoder_num_layers = r.Int("decoder_num_layers", c.decoder_num_layers);
  c.decoder_num_attention_heads = r.Int("decoder_num_attention_heads", c.decoder_num_attention_heads);
  c.decoder_attention_head_dim = r.Int("decoder_attention_head_dim", c.decoder_attention_head_dim);
  c.decoder_num_register_tokens = r.Int("decoder_num_register_tokens", c.decoder_num_register_tokens);
  c.decoder_ffn_mult = r.Double("decoder_ffn_mult", c.decoder_ffn_mult);
  c.decoder_rope_theta = r.Double("decoder_rope_theta", c.decoder_rope_theta);
  c.decoder_rope_dim_ratio = r.Double("decoder_rope_dim_ratio", c.decoder_rope_dim_ratio);
  c.decoder_norm_eps = r.Double("decoder_norm_eps", c.decoder_norm_eps);
  c.clip_length = r.Int("clip_length", c.clip_length);
  c.token_drop = r.Int("token_drop", c.token_drop);
  const size_t channels = static_cast<size_t>(std::clamp<int64_t>(c.latent_channels, 0, kMaxChannels));
  c.latents_mean = r.OptionalDoubleList("latents_mean").value_or(std::vector<double>(channels, 0.0));
  c.latents_std = r.OptionalDoubleList("latents_std").value_or(std::vector<double>(channels, 1.0));
  RETURN_IF_ERROR(r.status());

  if (c.latent_channels < 1 || c.out_channels < 1 || c.decoder_num_layers < 0 || c.decoder_num_attention_heads < 1 ||
      c.decoder_attention_head_dim < 1 || c.decoder_num_register_tokens < 0 || c.clip_length < 1 || c.token_drop < 0) {
    r.Fail(
        "channels, heads, head_dim and clip_length must be positive; layers, register tokens and token_drop "
        "non-negative");
  }
  if (c.latent_channels > kMaxChannels || c.clip_length > kMaxClipLength) {
    r.Fail(absl::StrCat("latent_channels (", c.latent_channels, ") and clip_length (", c.clip_length, ") are at most ",
                        kMaxChannels, " and ", kMaxClipLength));
  }
  for (const auto* factors : {&c.spatial_downsample_factors, &c.temporal_downsample_factors}) {
    int64_t product = 1;
    for (int64_t f : *factors) {
      if (f < 1) r.Fail(absl::StrCat("downsample factor ", f, " is not positive"));
      product *= std::clamp<int64_t>(f, 1, kMaxPatch + 1);
      product = std::min(product, kMaxPatch + 1);
    }
    if (product > kMaxPatch) r.Fail(absl::StrCat("downsample factors multiply to more than ", kMaxPatch));
  }
  if (c.latents_mean.size() != static_cast<size_t>(c.latent_channels) ||
      c.latents_std.size() != static_cast<size_t>(c.latent_channels)) {
    r.Fail(absl::StrCat("\"latents_mean\" and \"latents_std\" need ", c.latent_channels, " entries, have ",
                        c.latents_mean.size(), " and ", c.latents_std.size()));
  }
  if (c.ffn_inner_dim() < 1) r.Fail("decoder_ffn_mult leaves no feed-forward width");
  // MiniMaxH3VideoRotaryPosEmbed: the rotated channels split evenly over 3
  // axes of cos/sin pairs, and arange(0, 1, 6 / d) must give d / 6 frequencies.
  const int64_t d = c.rope_dim();
  if (d < 6 || d % 6 != 0 || d > c.decoder_attention_head_dim) {
    r.Fail(absl::StrCat("decoder RoPE dim ", d,
                        " (head_dim · rope_dim_ratio) must be a positive multiple of 6 "
                        "within the head"));
  } else if (static_cast<int64_t>(std::ceil(1.0 / (6.0 / static_cast<double>(d)))) != d / 6) {
    r.Fail(absl::StrCat("decoder RoPE dim ", d, " gives a frequency count diffusers cannot use"));
  }
  RETURN_IF_ERROR(r.status());
  c.in_channels = r.Int("in_channels", c.in_channels);
  c.block_out_channels = r.IntList("block_out_channels", c.block_out_channels);
  c.layers_per_block = r.Int("layers_per_block", c.layers_per_block);
  c.norm_num_groups = r.Int("norm_num_groups", c.norm_num_groups);
  c.norm_eps = r.Double("norm_eps", c.norm_eps);
  c.spatial_padding_mode = r.String("spatial_padding_mode", c.spatial_padding_mode);
  if (c.spatial_padding_mode == "constant") c.encoder_padding = PaddingMode::kZeros;
  if (c.spatial_padding_mode == "replicate") c.encoder_padding = PaddingMode::kReplicate;
  RETURN_IF_ERROR(r.status());
  c.unread_keys = r.UnreadKeys();
  return c;
}

}  // namespace vaedecode::families::minimax_h3
