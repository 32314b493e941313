#include "families/minimax_h3/blocks.h"

#include <cmath>
#include <optional>

#include <ATen/ATen.h>

namespace vaedecode::families::minimax_h3 {
namespace {

// x · rsqrt(mean(x², last dim) + eps): torch's rms_norm, as nn.RMSNorm calls
// it (its fused kernel rounds unlike the composite, which shows in bf16).
at::Tensor RmsNormalize(const at::Tensor& x, double eps, const std::optional<at::Tensor>& weight = std::nullopt) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

// 2·((i + 0.5)/n) − 1 for i in [first, first + count) of an n-long axis, float32.
at::Tensor AxisPositions(int64_t first, int64_t count, int64_t n, const c10::Device& device) {
  const at::Tensor grid = at::arange(0.5, static_cast<double>(n), at::TensorOptions().dtype(at::kFloat).device(device));
  return grid.narrow(0, first, count) / static_cast<double>(n) * 2.0 - 1.0;
}

// Rotate-half RoPE on the first cos.size(-1) channels of [B, L, heads, D].
at::Tensor ApplyRotary(const at::Tensor& x, const Rotary& rotary) {
  const int64_t d = rotary.cos.size(-1);
  const at::Tensor cos = rotary.cos.to(x.scalar_type()).unsqueeze(1);  // [L, 1, d]
  const at::Tensor sin = rotary.sin.to(x.scalar_type()).unsqueeze(1);
  const at::Tensor rot = x.narrow(-1, 0, d);
  const at::Tensor first = rot.narrow(-1, 0, d / 2), second = rot.narrow(-1, d / 2, d / 2);
  const at::Tensor rotated = at::cat({-second, first}, -1);
  return at::cat({rot * cos + rotated * sin, x.narrow(-1, d, x.size(-1) - d)}, -1);
}

}  // namespace

Rotary RotaryEmbedding(int64_t frames, int64_t first_row, int64_t band_rows, int64_t total_rows, int64_t width,
                       int64_t extra_tokens, int64_t rope_dim, double theta, const c10::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  // meshgrid(t, h, w, indexing="ij") flattened: tokens in (t, h, w) order.
  const std::vector<at::Tensor> grid =
      at::meshgrid({AxisPositions(0, frames, frames, device), AxisPositions(first_row, band_rows, total_rows, device),
                    AxisPositions(0, width, width, device)},
                   "ij");
  at::Tensor positions = at::stack(grid, -1).reshape({-1, 3});
  positions = at::cat({positions, at::zeros({extra_tokens, 3}, f32)}, 0);  // [L, 3]
  // inv_freq = 1 / theta^arange(0, 1, 6/d); angles 2π·pos·inv_freq per axis,
  // (t, h, w) concatenated, then tiled twice.
  const at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0.0, 1.0, 6.0 / static_cast<double>(rope_dim), f32));
  at::Tensor angles = (positions.unsqueeze(-1) * (2.0 * M_PI)) * inv_freq;  // [L, 3, d/6]
  angles = angles.flatten(1, 2).repeat({1, 2});                             // [L, d]
  return {angles.cos(), angles.sin()};
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) { return RmsNormalize(x, eps_, weight); }

AttentionImpl::AttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, double eps) : heads_(heads), eps_(eps) {
  const int64_t inner = heads * head_dim;
  to_q = register_module("to_q", torch::nn::Linear(dim, inner));
  to_k = register_module("to_k", torch::nn::Linear(dim, inner));
  to_v = register_module("to_v", torch::nn::Linear(dim, inner));
  to_out = register_module("to_out", torch::nn::ModuleList());
  to_out->push_back(torch::nn::Linear(inner, dim));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const Rotary& rotary, int64_t tokens_per_row,
                                  int64_t shared_tokens, LayerOps& ops) {
  const int64_t b = x.size(0), l = x.size(1);
  auto heads = [&](torch::nn::Linear& proj) { return proj->forward(x).view({b, l, heads_, -1}); };
  // The reference normalises q and k in float32 whatever the compute dtype.
  auto normed = [&](const at::Tensor& t) { return RmsNormalize(t.to(at::kFloat), eps_).to(t.scalar_type()); };
  const at::Tensor q = ApplyRotary(normed(heads(to_q)), rotary).transpose(1, 2);  // [B, heads, L, D]
  const at::Tensor k = ApplyRotary(normed(heads(to_k)), rotary).transpose(1, 2);
  const at::Tensor v = heads(to_v).transpose(1, 2);
  const at::Tensor out = ops.Attention(q, k, v, TokenLayout::Full(tokens_per_row, shared_tokens));
  return to_out[0]->as<torch::nn::Linear>()->forward(out.transpose(1, 2).reshape({b, l, -1}));
}

SwiGLUImpl::SwiGLUImpl(int64_t dim, int64_t inner_dim) {
  proj = register_module("proj", torch::nn::Linear(dim, 2 * inner_dim));
}

at::Tensor SwiGLUImpl::forward(const at::Tensor& x) {
  const std::vector<at::Tensor> value_gate = proj->forward(x).chunk(2, -1);
  return value_gate[0] * at::silu(value_gate[1]);
}

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t inner_dim) {
  net = register_module("net", torch::nn::ModuleList());
  net->push_back(SwiGLU(dim, inner_dim));
  net->push_back(torch::nn::Identity());  // diffusers' Dropout: no parameters
  net->push_back(torch::nn::Linear(inner_dim, dim));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return net[2]->as<torch::nn::Linear>()->forward(net[0]->as<SwiGLUImpl>()->forward(x));
}

TransformerBlockImpl::TransformerBlockImpl(int64_t dim, int64_t heads, int64_t head_dim, int64_t ffn_inner_dim,
                                           double eps) {
  norm1 = register_module("norm1", RMSNorm(dim, eps));
  attn = register_module("attn", Attention(dim, heads, head_dim, eps));
  scale1 = register_parameter("scale1", at::zeros({dim}));
  norm2 = register_module("norm2", RMSNorm(dim, eps));
  ff = register_module("ff", FeedForward(dim, ffn_inner_dim));
  scale2 = register_parameter("scale2", at::zeros({dim}));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x, const Rotary& rotary, int64_t tokens_per_row,
                                         int64_t shared_tokens, LayerOps& ops) {
  // The reference normalises in float32 whatever the compute dtype; with
  // float32 scales (kept like the norms) the residual stream is float32 from
  // the first block on, the normed activations take the projections' dtype.
  const at::ScalarType compute = attn->to_q->weight.scalar_type();
  const at::Tensor n1 = norm1->forward(x.to(at::kFloat)).to(compute);
  const at::Tensor h = x + attn->forward(n1, rotary, tokens_per_row, shared_tokens, ops) * scale1;
  const at::Tensor n2 = norm2->forward(h.to(at::kFloat)).to(compute);
  return h + ff->forward(n2) * scale2;
}

ViTDecoderImpl::ViTDecoderImpl(const MiniMaxH3Config& c) : config_(c) {
  const int64_t dim = c.dim();
  proj_in = register_module("proj_in", torch::nn::Linear(c.latent_channels, dim));
  register_tokens = register_parameter("register_tokens", at::zeros({1, c.decoder_num_register_tokens, dim}));
  transformer_blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.decoder_num_layers; ++i) {
    transformer_blocks->push_back(TransformerBlock(dim, c.decoder_num_attention_heads, c.decoder_attention_head_dim,
                                                   c.ffn_inner_dim(), c.decoder_norm_eps));
  }
  norm_out = register_module(
      "norm_out",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(c.decoder_norm_eps).elementwise_affine(true)));
  const int64_t p = c.patch_size();
  proj_out = register_module("proj_out", torch::nn::Linear(dim, c.out_channels * c.patch_size_t() * p * p));
}

at::Tensor ViTDecoderImpl::forward(const at::Tensor& z, LayerOps& ops) {
  const int64_t b = z.size(0), c = z.size(1), t = z.size(2), h = z.size(3), w = z.size(4);
  at::Tensor x = proj_in->forward(z.permute({0, 2, 3, 4, 1}).reshape({b, t * h * w, c}));
  const int64_t patches = x.size(1);
  // The register tokens, then one all-zero (CLS) token: the same on every rank.
  const int64_t shared = config_.decoder_num_register_tokens + 1;
  x = at::cat({x, register_tokens.expand({b, -1, -1}).to(x.scalar_type()), at::zeros_like(x.narrow(1, 0, 1))}, 1);
  const RowWindow rows = ops.GlobalRows(h);
  const Rotary rotary = RotaryEmbedding(t, rows.first, h, rows.total, w, shared, config_.rope_dim(),
                                        config_.decoder_rope_theta, z.device());
  for (const auto& block : *transformer_blocks) {
    x = block->as<TransformerBlockImpl>()->forward(x, rotary, /*tokens_per_row=*/w, shared, ops);
  }
  // norm_out is kept in float32, proj_out is not.
  x = norm_out->forward(x.to(norm_out->weight.scalar_type())).to(proj_out->weight.scalar_type());
  x = proj_out->forward(x).narrow(1, 0, patches);
  const int64_t pt = config_.patch_size_t(), p = config_.patch_size(), out = config_.out_channels;
  // view(B, T, H, W, C, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
  return x.reshape({b, t, h, w, out, pt, p, p})
      .permute({0, 4, 1, 5, 2, 6, 3, 7})
      .reshape({b, out, t * pt, h * p, w * p});
}

CausalConv3dImpl::CausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel, PaddingMode mode)
    : mode_(mode) {
  weight = register_parameter("weight", at::empty({out_channels, in_channels, kernel, kernel, kernel}));
  bias = register_parameter("bias", at::zeros({out_channels}));
}

at::Tensor CausalConv3dImpl::CausalFrames(const at::Tensor& x) const {
  const int64_t pad = weight.size(2) - 1;  // temporal_padding 2 for the 3-frame kernels, 0 for 1x1x1
  return pad > 0 ? at::constant_pad_nd(x, {0, 0, 0, 0, pad, 0}, 0.0) : x;
}

at::Tensor CausalConv3dImpl::forward(const at::Tensor& x, LayerOps& ops) {
  ConvGeometry g;
  g.padding_h = weight.size(3) / 2;
  g.padding_w = weight.size(4) / 2;
  g.mode = mode_;
  return ops.Conv(CausalFrames(x), weight, bias, g);
}

at::Tensor CausalConv3dImpl::Downsample(const at::Tensor& x, LayerOps& ops, int64_t temporal_stride,
                                        int64_t spatial_stride) {
  StridedConvGeometry g;
  g.stride = spatial_stride;
  g.stride_t = temporal_stride;
  if (spatial_stride == 2) g.pad_bottom = g.pad_right = 1;
  g.mode = mode_;
  return ops.StridedConv(CausalFrames(x), weight, bias, g);
}

at::Tensor FrameGroupNorm(LayerOps& ops, const torch::nn::GroupNorm& norm, const at::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  const at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
  const at::Tensor y = nn::RunGroupNorm(ops, norm, frames);
  return y.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4}).contiguous();
}

EncoderResnetImpl::EncoderResnetImpl(int64_t in_channels, int64_t out_channels, const MiniMaxH3Config& c) {
  const PaddingMode mode = c.encoder_padding;
  norm1 = register_module("norm1", nn::MakeGroupNorm(c.norm_num_groups, in_channels, c.norm_eps));
  conv1 = register_module("conv1", CausalConv3d(in_channels, out_channels, 3, mode));
  norm2 = register_module("norm2", nn::MakeGroupNorm(c.norm_num_groups, out_channels, c.norm_eps));
  conv2 = register_module("conv2", CausalConv3d(out_channels, out_channels, 3, mode));
  if (in_channels != out_channels) {
    conv_shortcut = register_module("conv_shortcut", CausalConv3d(in_channels, out_channels, 1, mode));
  }
}

at::Tensor EncoderResnetImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = conv1->forward(at::silu(FrameGroupNorm(ops, norm1, x)), ops);
  h = conv2->forward(at::silu(FrameGroupNorm(ops, norm2, h)), ops);
  return (conv_shortcut ? conv_shortcut->forward(x, ops) : x) + h;
}

DownsampleImpl::DownsampleImpl(int64_t channels, int64_t temporal_stride, int64_t spatial_stride, PaddingMode mode)
    : temporal_stride_(temporal_stride), spatial_stride_(spatial_stride) {
  conv = register_module("conv", CausalConv3d(channels, channels, 3, mode));
}

at::Tensor DownsampleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  return conv->Downsample(x, ops, temporal_stride_, spatial_stride_);
}

EncoderDownBlockImpl::EncoderDownBlockImpl(int64_t in_channels, int64_t out_channels, int64_t temporal_factor,
                                           int64_t spatial_factor, const MiniMaxH3Config& c) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t j = 0; j < c.layers_per_block; ++j) {
    resnets->push_back(EncoderResnet(j == 0 ? in_channels : out_channels, out_channels, c));
  }
  if (temporal_factor * spatial_factor > 1) {
    downsamplers = register_module("downsamplers", torch::nn::ModuleList());
    downsamplers->push_back(Downsample(out_channels, temporal_factor, spatial_factor, c.encoder_padding));
  }
}

at::Tensor EncoderDownBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<EncoderResnetImpl>()->forward(h, ops);
  if (downsamplers) {
    for (const auto& down : *downsamplers) h = down->as<DownsampleImpl>()->forward(h, ops);
  }
  return h;
}

VideoEncoderImpl::VideoEncoderImpl(const MiniMaxH3Config& c) {
  const std::vector<int64_t>& widths = c.block_out_channels;
  conv_in = register_module("conv_in", CausalConv3d(c.in_channels, widths[0], 3, c.encoder_padding));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < widths.size(); ++i) {
    // diffusers: block_in_channels = (widths[0],) + widths[:-1]
    down_blocks->push_back(EncoderDownBlock(widths[i == 0 ? 0 : i - 1], widths[i], c.temporal_downsample_factors[i],
                                            c.spatial_downsample_factors[i], c));
  }
  norm_out = register_module("norm_out", nn::MakeGroupNorm(c.norm_num_groups, widths.back(), c.norm_eps));
  conv_out = register_module("conv_out", CausalConv3d(widths.back(), 2 * c.latent_channels, 3, c.encoder_padding));
}

at::Tensor VideoEncoderImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = conv_in->forward(x, ops);
  for (const auto& block : *down_blocks) h = block->as<EncoderDownBlockImpl>()->forward(h, ops);
  return conv_out->forward(at::silu(FrameGroupNorm(ops, norm_out, h)), ops);
}

}  // namespace vaedecode::families::minimax_h3
