#pragma once

// LibTorch mirrors of the ViT decoder of diffusers' AutoencoderKLMiniMaxH3
// (MiniMaxH3VideoViTDecoder3d and its blocks), children under the diffusers
// attribute names so named_parameters() equals the state-dict keys
// (decoder.transformer_blocks.0.attn.to_q.weight, ...ff.net.0.proj.weight).
//
// Sharded by latent rows: every token is a latent voxel, so a rank holds the
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

}  // namespace vaedecode::families::minimax_h3
