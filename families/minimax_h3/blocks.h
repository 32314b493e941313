#pragma once

// LibTorch mirrors of the ViT decoder of diffusers' AutoencoderKLMiniMaxH3
// (MiniMaxH3VideoViTDecoder3d and its blocks) and of its causal CNN encoder
// (MiniMaxH3VideoEncoder3d), children under the diffusers attribute names so
// named_parameters() equals the state-dict keys
// (decoder.transformer_blocks.0.attn.to_q.weight, encoder.conv_in.weight).
//
// The encoder shards by rows too, bands cut in whole latent rows at every
// level (MiniMaxH3Encoder::RowLevels): its 3x3x3 convs are halo
// convolutions with the spatial padding (reflect in the release) applied at
// the global edges only; a downsampler's bottom/right pad of 1 then stride 2
// is a strided halo convolution whose pad exists only below the last band;
// its GroupNorms, per frame, merge their statistics over the bands (one
// all-reduce each, every frame at once); time is never sharded (the causal
// zero frames are local). The decoder:
// sharded by latent rows: every token is a latent voxel, so a rank holds the
// tokens of its band (every frame, its rows, every column). Everything but
// attention is per token (Linear, RMSNorm, SwiGLU, LayerNorm, the
// unpatchify, which turns each latent row into patch_size rows). RoPE
// positions use the band's global rows (LayerOps::GlobalRows). The register
// tokens and the all-zero CLS token are the same on every rank; attention
// (TokenLayout::Full with shared_tokens) gathers the bands' K/V once per
// layer and adds the shared tokens' K/V once, and every rank computes their
// queries itself, so they stay equal everywhere without a broadcast.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/layer_ops.h"
#include "families/minimax_h3/config.h"
#include "families/nn/modules.h"

namespace vaedecode::families::minimax_h3 {

// cos and sin of MiniMaxH3VideoRotaryPosEmbed for every token, [L, rope_dim]
// (float32): positions 2·((i + 0.5)/n) − 1 per axis (t, h, w; h from the
// band's global rows), all 0 for the `extra_tokens` appended ones.
struct Rotary {
  at::Tensor cos;
  at::Tensor sin;
};
Rotary RotaryEmbedding(int64_t frames, int64_t first_row, int64_t band_rows, int64_t total_rows, int64_t width,
                       int64_t extra_tokens, int64_t rope_dim, double theta, const c10::Device& device);

// nn.RMSNorm(dim, eps, elementwise_affine=True) as torch's composite
// rms_norm computes it: x · rsqrt(mean(x², last dim) + eps) · weight.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// diffusers MiniMaxH3VideoAttention with its processor: q/k weightless RMS
// norms over head_dim (in float32), rotate-half RoPE on the first rope_dim
// channels of each head, full attention, to_out.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, double eps);
  // x: [B, N + shared, dim], the band's tokens then the shared ones.
  at::Tensor forward(const at::Tensor& x, const Rotary& rotary, int64_t tokens_per_row, int64_t shared_tokens,
                     LayerOps& ops);

  torch::nn::Linear to_q{nullptr};
  torch::nn::Linear to_k{nullptr};
  torch::nn::Linear to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [0]: Linear (diffusers' [1] is Dropout)

 private:
  int64_t heads_;
  double eps_;
};
TORCH_MODULE(Attention);

// diffusers SwiGLU: proj to 2·inner channels, [value; gate], value·silu(gate).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t dim, int64_t inner_dim);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(SwiGLU);

// diffusers FeedForward(activation_fn="swiglu"): net.0 SwiGLU, net.1
// Dropout (inactive), net.2 Linear back to dim.
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t inner_dim);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList net{nullptr};
};
TORCH_MODULE(FeedForward);

// diffusers MiniMaxH3VideoTransformerBlock: x + attn(RMSNorm(x))·scale1,
// then + FFN(RMSNorm(x))·scale2, the norms in float32.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(int64_t dim, int64_t heads, int64_t head_dim, int64_t ffn_inner_dim, double eps);
  at::Tensor forward(const at::Tensor& x, const Rotary& rotary, int64_t tokens_per_row, int64_t shared_tokens,
                     LayerOps& ops);

  RMSNorm norm1{nullptr};
  Attention attn{nullptr};
  at::Tensor scale1;
  RMSNorm norm2{nullptr};
  FeedForward ff{nullptr};
  at::Tensor scale2;
};
TORCH_MODULE(TransformerBlock);

// diffusers MiniMaxH3VideoViTDecoder3d.
class ViTDecoderImpl : public torch::nn::Module {
 public:
  explicit ViTDecoderImpl(const MiniMaxH3Config& config);
  // [B, C, t, h, w] (h: this rank's band) -> [B, out, t·pt, h·p, w·p]
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);

  torch::nn::Linear proj_in{nullptr};
  at::Tensor register_tokens;  // [1, R, dim]
  torch::nn::ModuleList transformer_blocks{nullptr};
  torch::nn::LayerNorm norm_out{nullptr};
  torch::nn::Linear proj_out{nullptr};

 private:
  MiniMaxH3Config config_;
};
TORCH_MODULE(ViTDecoder);

// diffusers MiniMaxH3VideoCausalConv3d as the encoder uses it: spatial
// padding `spatial_padding` in `mode`, 2 zero frames in front for a 3-frame
// kernel (causal), then a plain Conv3d. A module holding the weight and bias
// directly (the class subclasses nn.Conv3d).
class CausalConv3dImpl : public torch::nn::Module {
 public:
  CausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel, PaddingMode mode);
  // Stride 1, padding k/2 in H and W: [B, C, T, H, W] -> [B, C', T, H, W].
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);
  // MiniMaxH3VideoDownsample3d: stride (t, s, s), and for s = 2 a
  // bottom/right pad of 1 first (rows -> floor(rows / 2), though diffusers'
  // docstring says ceil); other s pad nothing.
  at::Tensor Downsample(const at::Tensor& x, LayerOps& ops, int64_t temporal_stride, int64_t spatial_stride);

  at::Tensor weight;
  at::Tensor bias;

 private:
  at::Tensor CausalFrames(const at::Tensor& x) const;  // the zero frames in front
  PaddingMode mode_;
};
TORCH_MODULE(CausalConv3d);

// diffusers MiniMaxH3VideoGroupNorm: GroupNorm of each frame on its own.
// [B, C, T, H, W] -> same.
at::Tensor FrameGroupNorm(LayerOps& ops, const torch::nn::GroupNorm& norm, const at::Tensor& x);

// diffusers MiniMaxH3VideoResnetBlock3d.
class EncoderResnetImpl : public torch::nn::Module {
 public:
  EncoderResnetImpl(int64_t in_channels, int64_t out_channels, const MiniMaxH3Config& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::GroupNorm norm1{nullptr};
  CausalConv3d conv1{nullptr};
  torch::nn::GroupNorm norm2{nullptr};
  CausalConv3d conv2{nullptr};
  CausalConv3d conv_shortcut{nullptr};  // 1x1x1, only when widths differ
};
TORCH_MODULE(EncoderResnet);

// diffusers MiniMaxH3VideoDownsample3d: a `conv` child.
class DownsampleImpl : public torch::nn::Module {
 public:
  DownsampleImpl(int64_t channels, int64_t temporal_stride, int64_t spatial_stride, PaddingMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  CausalConv3d conv{nullptr};

 private:
  int64_t temporal_stride_;
  int64_t spatial_stride_;
};
TORCH_MODULE(Downsample);

// diffusers MiniMaxH3VideoDownBlock3d: the resnets, then a downsampler when
// the level's factors are not both 1.
class EncoderDownBlockImpl : public torch::nn::Module {
 public:
  EncoderDownBlockImpl(int64_t in_channels, int64_t out_channels, int64_t temporal_factor, int64_t spatial_factor,
                       const MiniMaxH3Config& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};  // absent at levels that keep the size (diffusers' None)
};
TORCH_MODULE(EncoderDownBlock);

// diffusers MiniMaxH3VideoEncoder3d followed by the model's quant_conv is
// MiniMaxH3EncodeModule's (encoder.h); this is the encoder alone.
class VideoEncoderImpl : public torch::nn::Module {
 public:
  explicit VideoEncoderImpl(const MiniMaxH3Config& config);  // config.CheckEncoder() passed
  // One clip: [B, in, T, H, W] -> [B, 2·latent_channels, T', H', W'] (MiniMaxH3Encoder::LatentShape).
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  CausalConv3d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  CausalConv3d conv_out{nullptr};
};
TORCH_MODULE(VideoEncoder);

}  // namespace vaedecode::families::minimax_h3
