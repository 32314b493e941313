#include "families/autoencoder_kl/blocks.h"

#include <ATen/ATen.h>

namespace vaedecode::families::autoencoder_kl {

ResnetBlock2DImpl::ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups, double eps) {
  norm1 = register_module("norm1", nn::MakeGroupNorm(groups, in_channels, eps));
  conv1 = register_module("conv1", nn::MakeConv2d(in_channels, out_channels, 3));
  norm2 = register_module("norm2", nn::MakeGroupNorm(groups, out_channels, eps));
  conv2 = register_module("conv2", nn::MakeConv2d(out_channels, out_channels, 3));
  if (in_channels != out_channels) {
    conv_shortcut = register_module("conv_shortcut", nn::MakeConv2d(in_channels, out_channels, 1));
  }
}

at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = at::silu(nn::RunGroupNorm(ops, norm1, x));
  h = nn::RunConv2d(ops, conv1, h);
  h = at::silu(nn::RunGroupNorm(ops, norm2, h));
  h = nn::RunConv2d(ops, conv2, h);
  const at::Tensor shortcut = conv_shortcut ? nn::RunConv2d(ops, conv_shortcut, x) : x;
  return shortcut + h;
}

AttentionImpl::AttentionImpl(int64_t channels, int64_t head_dim, int64_t groups, double eps)
    : heads_(channels / head_dim) {
  group_norm = register_module("group_norm", nn::MakeGroupNorm(groups, channels, eps));
  to_q = register_module("to_q", torch::nn::Linear(channels, channels));
  to_k = register_module("to_k", torch::nn::Linear(channels, channels));
  to_v = register_module("to_v", torch::nn::Linear(channels, channels));
  to_out = register_module("to_out", torch::nn::ModuleList());
  to_out->push_back(torch::nn::Linear(channels, channels));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t head_dim = c / heads_;
  // Tokens are pixels in row-major order: a row band is a contiguous run.
  at::Tensor tokens = nn::RunGroupNorm(ops, group_norm, x).view({b, c, h * w}).transpose(1, 2);  // [B, N, C]
  auto split_heads = [&](const at::Tensor& t) {
    return t.view({b, -1, heads_, head_dim}).transpose(1, 2);  // [B, heads, N, D]
  };
  at::Tensor q = split_heads(to_q->forward(tokens));
  at::Tensor k = split_heads(to_k->forward(tokens));
  at::Tensor v = split_heads(to_v->forward(tokens));
  at::Tensor out =
      ops.Attention(q, k, v, TokenLayout::Full(/*tokens_per_row=*/w)).transpose(1, 2).reshape({b, -1, c});  // [B, N, C]
  out = to_out[0]->as<torch::nn::Linear>()->forward(out);
  out = out.transpose(-1, -2).reshape({b, c, h, w});
  return out + x;
}

UNetMidBlock2DImpl::UNetMidBlock2DImpl(int64_t channels, int64_t groups, double eps, bool add_attention) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(ResnetBlock2D(channels, channels, groups, eps));
  if (add_attention) attentions->push_back(Attention(channels, channels, groups, eps));
  resnets->push_back(ResnetBlock2D(channels, channels, groups, eps));
}

at::Tensor UNetMidBlock2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = resnets[0]->as<ResnetBlock2DImpl>()->forward(x, ops);
  if (!attentions->is_empty()) h = attentions[0]->as<AttentionImpl>()->forward(h, ops);
  return resnets[1]->as<ResnetBlock2DImpl>()->forward(h, ops);
}

Upsample2DImpl::Upsample2DImpl(int64_t channels) {
  conv = register_module("conv", nn::MakeConv2d(channels, channels, 3));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  return nn::RunConv2d(ops, conv, nn::UpsampleNearest(x, 1, 2));
}

UpDecoderBlock2DImpl::UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                           int64_t groups, double eps, bool add_upsample) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  upsamplers = register_module("upsamplers", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    resnets->push_back(ResnetBlock2D(i == 0 ? in_channels : out_channels, out_channels, groups, eps));
  }
  if (add_upsample) upsamplers->push_back(Upsample2D(out_channels));
}

at::Tensor UpDecoderBlock2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<ResnetBlock2DImpl>()->forward(h, ops);
  for (const auto& up : *upsamplers) h = up->as<Upsample2DImpl>()->forward(h, ops);
  return h;
}

Downsample2DImpl::Downsample2DImpl(int64_t channels) {
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).stride(2)));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  StridedConvGeometry g;
  g.stride = 2;
  g.pad_bottom = 1;
  g.pad_right = 1;
  return ops.StridedConv(x, conv->weight, conv->bias, g);
}

DownEncoderBlock2DImpl::DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers,
                                               int64_t groups, double eps, bool add_downsample) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  downsamplers = register_module("downsamplers", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    resnets->push_back(ResnetBlock2D(i == 0 ? in_channels : out_channels, out_channels, groups, eps));
  }
  if (add_downsample) downsamplers->push_back(Downsample2D(out_channels));
}

at::Tensor DownEncoderBlock2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<ResnetBlock2DImpl>()->forward(h, ops);
  for (const auto& down : *downsamplers) h = down->as<Downsample2DImpl>()->forward(h, ops);
  return h;
}

}  // namespace vaedecode::families::autoencoder_kl
