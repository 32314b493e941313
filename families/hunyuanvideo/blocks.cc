#include "families/hunyuanvideo/blocks.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "families/nn/modules.h"

namespace vaedecode::families::hunyuanvideo {
namespace {

constexpr double kEps = 1e-6;  // HunyuanVideoDecoder3D: resnet_eps and conv_norm_out eps

}  // namespace

HunyuanVideoResnetBlockCausal3DImpl::HunyuanVideoResnetBlockCausal3DImpl(int64_t in_channels, int64_t out_channels,
                                                                         int64_t groups, double eps) {
  norm1 = register_module("norm1", nn::MakeGroupNorm(groups, in_channels, eps));
  conv1 = register_module("conv1", nn::ReplicateCausalConv3d(in_channels, out_channels, 3));
  norm2 = register_module("norm2", nn::MakeGroupNorm(groups, out_channels, eps));
  conv2 = register_module("conv2", nn::ReplicateCausalConv3d(out_channels, out_channels, 3));
  if (in_channels != out_channels) {
    conv_shortcut = register_module("conv_shortcut", nn::ReplicateCausalConv3d(in_channels, out_channels, 1));
  }
}

at::Tensor HunyuanVideoResnetBlockCausal3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = at::silu(nn::RunGroupNorm(ops, norm1, x));
  h = conv1->forward(h, ops);
  h = at::silu(nn::RunGroupNorm(ops, norm2, h));
  h = conv2->forward(h, ops);
  const at::Tensor shortcut = conv_shortcut ? conv_shortcut->forward(x, ops) : x;
  return h + shortcut;
}

HunyuanVideoAttentionImpl::HunyuanVideoAttentionImpl(int64_t channels, int64_t groups, double eps)
    : autoencoder_kl::AttentionImpl(channels, /*head_dim=*/channels, groups, eps) {}

at::Tensor HunyuanVideoAttentionImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  // The norm's statistics span T·H·W, as over diffusers' [B, C, T·H·W] tokens.
  const at::Tensor normed = nn::RunGroupNorm(ops, group_norm, x);
  // Tokens frame by frame, pixels row-major: [B, T·H·W, C].
  const at::Tensor tokens = normed.permute({0, 2, 3, 4, 1}).reshape({b, t * h * w, c});
  auto frames = [&](const at::Tensor& y) { return y.view({b, 1, t, h * w, c}); };  // [B, heads=1, T, N, D]
  const at::Tensor q = frames(to_q->forward(tokens));
  const at::Tensor k = frames(to_k->forward(tokens));
  const at::Tensor v = frames(to_v->forward(tokens));
  at::Tensor out = ops.Attention(q, k, v, TokenLayout::FrameCausal(/*tokens_per_row=*/w)).reshape({b, t * h * w, c});
  out = to_out[0]->as<torch::nn::Linear>()->forward(out);
  out = out.view({b, t, h, w, c}).permute({0, 4, 1, 2, 3});  // [B, C, T, H, W]
  return out + x;
}

HunyuanVideoMidBlock3DImpl::HunyuanVideoMidBlock3DImpl(int64_t channels, int64_t groups, double eps,
                                                       bool add_attention) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(HunyuanVideoResnetBlockCausal3D(channels, channels, groups, eps));
  if (add_attention) attentions->push_back(HunyuanVideoAttention(channels, groups, eps));
  resnets->push_back(HunyuanVideoResnetBlockCausal3D(channels, channels, groups, eps));
}

at::Tensor HunyuanVideoMidBlock3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = resnets[0]->as<HunyuanVideoResnetBlockCausal3DImpl>()->forward(x, ops);
  if (!attentions->is_empty()) h = attentions[0]->as<HunyuanVideoAttentionImpl>()->forward(h, ops);
  return resnets[1]->as<HunyuanVideoResnetBlockCausal3DImpl>()->forward(h, ops);
}

HunyuanVideoUpsampleCausal3DImpl::HunyuanVideoUpsampleCausal3DImpl(int64_t channels, bool upsample_time,
                                                                   bool upsample_space)
    : factor_t_(upsample_time ? 2 : 1), factor_s_(upsample_space ? 2 : 1) {
  conv = register_module("conv", nn::ReplicateCausalConv3d(channels, channels, 3));
}

at::Tensor HunyuanVideoUpsampleCausal3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t frames = x.size(2);
  at::Tensor h = nn::UpsampleNearest(x.narrow(2, 0, 1), 1, factor_s_);  // the first frame: space only
  if (frames > 1) h = at::cat({h, nn::UpsampleNearest(x.narrow(2, 1, frames - 1), factor_t_, factor_s_)}, 2);
  return conv->forward(h, ops);
}

HunyuanVideoUpBlock3DImpl::HunyuanVideoUpBlock3DImpl(const UpBlockSpec& spec, int64_t groups, double eps) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  upsamplers = register_module("upsamplers", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(
        HunyuanVideoResnetBlockCausal3D(i == 0 ? spec.in_channels : spec.out_channels, spec.out_channels, groups, eps));
  }
  if (spec.upsample_space || spec.upsample_time) {
    upsamplers->push_back(HunyuanVideoUpsampleCausal3D(spec.out_channels, spec.upsample_time, spec.upsample_space));
  }
}

at::Tensor HunyuanVideoUpBlock3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<HunyuanVideoResnetBlockCausal3DImpl>()->forward(h, ops);
  for (const auto& up : *upsamplers) h = up->as<HunyuanVideoUpsampleCausal3DImpl>()->forward(h, ops);
  return h;
}

void BlendFramesIntoNext(const at::Tensor& prev, at::Tensor& tile, int64_t blend) {
  const int64_t extent = std::min({prev.size(2), tile.size(2), blend});
  for (int64_t x = 0; x < extent; ++x) {
    const double w = static_cast<double>(x) / static_cast<double>(extent);
    tile.select(2, x).copy_(prev.select(2, prev.size(2) - extent + x) * (1 - w) + tile.select(2, x) * w);
  }
}

HunyuanVideoDownsampleCausal3DImpl::HunyuanVideoDownsampleCausal3DImpl(int64_t channels, bool downsample_time,
                                                                       bool downsample_space)
    : downsample_time_(downsample_time), downsample_space_(downsample_space) {
  conv = register_module("conv", nn::ReplicateCausalConv3d(channels, channels, 3));
}

at::Tensor HunyuanVideoDownsampleCausal3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  // Temporal replicate padding (2 copies of the first frame in front), then
  // the rows and columns replicate-padded by one each side in the strided conv.
  const at::Tensor padded = at::cat({x.narrow(2, 0, 1).repeat({1, 1, 2, 1, 1}), x}, 2);
  StridedConvGeometry g;
  g.stride = downsample_space_ ? 2 : 1;
  g.stride_t = downsample_time_ ? 2 : 1;
  g.pad_top = g.pad_bottom = g.pad_left = g.pad_right = 1;
  g.mode = PaddingMode::kReplicate;
  return ops.StridedConv(padded, conv->conv->weight, conv->conv->bias, g);
}

HunyuanVideoDownBlock3DImpl::HunyuanVideoDownBlock3DImpl(const DownBlockSpec& spec, int64_t groups, double eps) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(
        HunyuanVideoResnetBlockCausal3D(i == 0 ? spec.in_channels : spec.out_channels, spec.out_channels, groups, eps));
  }
  if (spec.downsample_time || spec.downsample_space) {
    downsamplers = register_module("downsamplers", torch::nn::ModuleList());
    downsamplers->push_back(
        HunyuanVideoDownsampleCausal3D(spec.out_channels, spec.downsample_time, spec.downsample_space));
  }
}

at::Tensor HunyuanVideoDownBlock3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<HunyuanVideoResnetBlockCausal3DImpl>()->forward(h, ops);
  if (downsamplers) h = downsamplers[0]->as<HunyuanVideoDownsampleCausal3DImpl>()->forward(h, ops);
  return h;
}

HunyuanVideoEncoder3DImpl::HunyuanVideoEncoder3DImpl(const HunyuanVideoConfig& c) {
  const int64_t widest = c.block_out_channels.back();
  conv_in = register_module("conv_in", nn::ReplicateCausalConv3d(c.in_channels, c.block_out_channels.front(), 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (const DownBlockSpec& spec : c.DownBlocks()) {
    down_blocks->push_back(HunyuanVideoDownBlock3D(spec, c.norm_num_groups, kEps));
  }
  mid_block =
      register_module("mid_block", HunyuanVideoMidBlock3D(widest, c.norm_num_groups, kEps, c.mid_block_add_attention));
  conv_norm_out = register_module("conv_norm_out", nn::MakeGroupNorm(c.norm_num_groups, widest, kEps));
  conv_out = register_module("conv_out", nn::ReplicateCausalConv3d(widest, 2 * c.latent_channels, 3));
}

at::Tensor HunyuanVideoEncoder3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = conv_in->forward(x, ops);
  for (const auto& block : *down_blocks) h = block->as<HunyuanVideoDownBlock3DImpl>()->forward(h, ops);
  h = mid_block->forward(h, ops);
  return conv_out->forward(at::silu(nn::RunGroupNorm(ops, conv_norm_out, h)), ops);
}

HunyuanVideoDecoder3DImpl::HunyuanVideoDecoder3DImpl(const HunyuanVideoConfig& c) {
  const int64_t widest = c.block_out_channels.back();
  conv_in = register_module("conv_in", nn::ReplicateCausalConv3d(c.latent_channels, widest, 3));
  mid_block =
      register_module("mid_block", HunyuanVideoMidBlock3D(widest, c.norm_num_groups, kEps, c.mid_block_add_attention));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (const UpBlockSpec& spec : c.UpBlocks())
    up_blocks->push_back(HunyuanVideoUpBlock3D(spec, c.norm_num_groups, kEps));
  conv_norm_out =
      register_module("conv_norm_out", nn::MakeGroupNorm(c.norm_num_groups, c.block_out_channels.front(), kEps));
  conv_out = register_module("conv_out", nn::ReplicateCausalConv3d(c.block_out_channels.front(), c.out_channels, 3));
}

at::Tensor HunyuanVideoDecoder3DImpl::forward(const at::Tensor& z, LayerOps& ops) {
  at::Tensor h = conv_in->forward(z, ops);
  h = mid_block->forward(h, ops);
  for (const auto& block : *up_blocks) h = block->as<HunyuanVideoUpBlock3DImpl>()->forward(h, ops);
  h = at::silu(nn::RunGroupNorm(ops, conv_norm_out, h));
  return conv_out->forward(h, ops);
}

}  // namespace vaedecode::families::hunyuanvideo
