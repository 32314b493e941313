#include "families/hunyuanimage/blocks.h"

#include <ATen/ATen.h>

#include "families/nn/modules.h"

namespace vaedecode::families::hunyuanimage {
namespace {

constexpr int64_t kGroups = HunyuanImageConfig::kNormGroups;
constexpr double kEps = HunyuanImageConfig::kNormEps;

}  // namespace

ResnetBlockImpl::ResnetBlockImpl(int64_t channels) {
  norm1 = register_module("norm1", nn::MakeGroupNorm(kGroups, channels, kEps));
  conv1 = register_module("conv1", nn::MakeConv2d(channels, channels, 3));
  norm2 = register_module("norm2", nn::MakeGroupNorm(kGroups, channels, kEps));
  conv2 = register_module("conv2", nn::MakeConv2d(channels, channels, 3));
}

at::Tensor ResnetBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = nn::RunConv2d(ops, conv1, at::silu(nn::RunGroupNorm(ops, norm1, x)));
  h = nn::RunConv2d(ops, conv2, at::silu(nn::RunGroupNorm(ops, norm2, h)));
  return h + x;
}

AttentionBlockImpl::AttentionBlockImpl(int64_t channels) {
  norm = register_module("norm", nn::MakeGroupNorm(kGroups, channels, kEps));
  to_q = register_module("to_q", nn::MakeConv2d(channels, channels, 1));
  to_k = register_module("to_k", nn::MakeConv2d(channels, channels, 1));
  to_v = register_module("to_v", nn::MakeConv2d(channels, channels, 1));
  proj = register_module("proj", nn::MakeConv2d(channels, channels, 1));
}

at::Tensor AttentionBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const at::Tensor normed = nn::RunGroupNorm(ops, norm, x);
  // [B, C, H, W] -> [B, 1, H·W, C]: one head, pixels row-major (a band's
  // tokens are contiguous).
  auto tokens = [&](const torch::nn::Conv2d& conv) {
    return nn::RunConv2d(ops, conv, normed).permute({0, 2, 3, 1}).reshape({b, 1, h * w, c});
  };
  const at::Tensor attended =
      ops.Attention(tokens(to_q), tokens(to_k), tokens(to_v), TokenLayout::Full(/*tokens_per_row=*/w));
  const at::Tensor image = attended.reshape({b, h, w, c}).permute({0, 3, 1, 2});
  return nn::RunConv2d(ops, proj, image) + x;
}

UpsampleImpl::UpsampleImpl(int64_t in_channels, int64_t out_channels) : repeats_(4 * out_channels / in_channels) {
  conv = register_module("conv", nn::MakeConv2d(in_channels, 4 * out_channels, 3));
}

at::Tensor UpsampleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = nn::SubpixelMajorDepthToSpace(nn::RunConv2d(ops, conv, x), 1, 2, 2);
  return h + nn::SubpixelMajorDepthToSpace(x.repeat_interleave(repeats_, 1), 1, 2, 2);
}

DownsampleImpl::DownsampleImpl(int64_t in_channels, int64_t out_channels) : out_channels_(out_channels) {
  conv = register_module("conv", nn::MakeConv2d(in_channels, out_channels / 4, 3));
}

at::Tensor DownsampleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = nn::SubpixelMajorSpaceToDepth(nn::RunConv2d(ops, conv, x), 1, 2, 2);  // [B, out, H/2, W/2]
  const at::Tensor shortcut = nn::SubpixelMajorSpaceToDepth(x, 1, 2, 2);                     // [B, 4·in, H/2, W/2]
  return h + nn::ChannelGroupMean(shortcut, out_channels_);
}

MidBlockImpl::MidBlockImpl(int64_t channels) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(ResnetBlock(channels));
  attentions->push_back(AttentionBlock(channels));
  resnets->push_back(ResnetBlock(channels));
}

at::Tensor MidBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = resnets[0]->as<ResnetBlockImpl>()->forward(x, ops);
  h = attentions[0]->as<AttentionBlockImpl>()->forward(h, ops);
  return resnets[1]->as<ResnetBlockImpl>()->forward(h, ops);
}

Encoder2DImpl::Encoder2DImpl(const HunyuanImageConfig& c)
    : group_size_(c.block_out_channels.back() / (2 * c.latent_channels)) {
  conv_in = register_module("conv_in", nn::MakeConv2d(c.in_channels, c.block_out_channels.front(), 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (const DownLayerSpec& l : c.DownLayers()) {
    if (l.downsample) {
      down_blocks->push_back(Downsample(l.in_channels, l.out_channels));
    } else {
      down_blocks->push_back(ResnetBlock(l.out_channels));  // equal widths (CheckEncoder)
    }
  }
  const int64_t last = c.block_out_channels.back();
  mid_block = register_module("mid_block", MidBlock(last));
  norm_out = register_module("norm_out", nn::MakeGroupNorm(kGroups, last, kEps));
  conv_out = register_module("conv_out", nn::MakeConv2d(last, 2 * c.latent_channels, 3));
}

at::Tensor Encoder2DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = nn::RunConv2d(ops, conv_in, x);
  for (const auto& layer : *down_blocks) {
    if (auto* down = layer->as<DownsampleImpl>()) {
      h = down->forward(h, ops);
    } else {
      h = layer->as<ResnetBlockImpl>()->forward(h, ops);
    }
  }
  h = mid_block->forward(h, ops);
  const at::Tensor residual = nn::ChannelGroupMean(h, h.size(1) / group_size_);
  h = nn::RunConv2d(ops, conv_out, at::silu(nn::RunGroupNorm(ops, norm_out, h)));
  return h + residual;
}

Decoder2DImpl::Decoder2DImpl(const HunyuanImageConfig& c) : conv_in_repeats_(c.conv_in_repeats()) {
  const std::vector<int64_t> widths = c.decoder_widths();
  conv_in = register_module("conv_in", nn::MakeConv2d(c.latent_channels, widths.front(), 3));
  mid_block = register_module("mid_block", MidBlock(widths.front()));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (const UpLayerSpec& l : c.UpLayers()) {
    if (l.upsample) {
      up_blocks->push_back(Upsample(l.in_channels, l.out_channels));
    } else {
      up_blocks->push_back(ResnetBlock(l.out_channels));
    }
  }
  norm_out = register_module("norm_out", nn::MakeGroupNorm(kGroups, widths.back(), kEps));
  conv_out = register_module("conv_out", nn::MakeConv2d(widths.back(), c.out_channels, 3));
}

at::Tensor Decoder2DImpl::forward(const at::Tensor& z, LayerOps& ops) {
  at::Tensor h = nn::RunConv2d(ops, conv_in, z) + z.repeat_interleave(conv_in_repeats_, 1);
  h = mid_block->forward(h, ops);
  for (const auto& layer : *up_blocks) {
    if (auto* resnet = layer->as<ResnetBlockImpl>()) {
      h = resnet->forward(h, ops);
    } else {
      h = layer->as<UpsampleImpl>()->forward(h, ops);
    }
  }
  return nn::RunConv2d(ops, conv_out, at::silu(nn::RunGroupNorm(ops, norm_out, h)));
}

}  // namespace vaedecode::families::hunyuanimage
