#include "families/hunyuanimage3/blocks.h"

#include <ATen/ATen.h>

#include "families/nn/modules.h"

namespace vaedecode::families::hunyuanimage3 {
namespace {

constexpr int64_t kGroups = HunyuanImage3Config::kNormGroups;
constexpr double kEps = HunyuanImage3Config::kNormEps;

at::Tensor Swish(const at::Tensor& x) { return at::silu(x); }  // x · sigmoid(x)

}  // namespace

ResnetBlockImpl::ResnetBlockImpl(int64_t in_channels, int64_t out_channels) {
  norm1 = register_module("norm1", nn::MakeGroupNorm(kGroups, in_channels, kEps));
  conv1 = register_module("conv1", nn::MakeConv3d(in_channels, out_channels, 3));
  norm2 = register_module("norm2", nn::MakeGroupNorm(kGroups, out_channels, kEps));
  conv2 = register_module("conv2", nn::MakeConv3d(out_channels, out_channels, 3));
  if (in_channels != out_channels) {
    nin_shortcut = register_module("nin_shortcut", nn::MakeConv3d(in_channels, out_channels, 1));
  }
}

at::Tensor ResnetBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = nn::RunConv3d(ops, conv1, Swish(nn::RunGroupNorm(ops, norm1, x)));
  h = nn::RunConv3d(ops, conv2, Swish(nn::RunGroupNorm(ops, norm2, h)));
  return (nin_shortcut ? nn::RunConv3d(ops, nin_shortcut, x) : x) + h;
}

AttnBlockImpl::AttnBlockImpl(int64_t channels) {
  norm = register_module("norm", nn::MakeGroupNorm(kGroups, channels, kEps));
  q = register_module("q", nn::MakeConv3d(channels, channels, 1));
  k = register_module("k", nn::MakeConv3d(channels, channels, 1));
  v = register_module("v", nn::MakeConv3d(channels, channels, 1));
  proj_out = register_module("proj_out", nn::MakeConv3d(channels, channels, 1));
}

at::Tensor AttnBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2), h = x.size(3), w = x.size(4);
  const at::Tensor normed = nn::RunGroupNorm(ops, norm, x);
  // One head over every token. The release orders them (f, h, w); these
  // go (h, f, w), so a row band's tokens are contiguous: the same attention
  // (keys and queries permuted alike), identical for one frame.
  auto tokens = [&](const torch::nn::Conv3d& conv) {
    return nn::RunConv3d(ops, conv, normed).permute({0, 3, 2, 4, 1}).reshape({b, 1, h * f * w, c});
  };
  const at::Tensor attended =
      ops.Attention(tokens(q), tokens(k), tokens(v), TokenLayout::Full(/*tokens_per_row=*/f * w));
  const at::Tensor video = attended.reshape({b, h, f, w, c}).permute({0, 4, 2, 1, 3});
  return x + nn::RunConv3d(ops, proj_out, video);
}

MidImpl::MidImpl(int64_t channels) {
  block_1 = register_module("block_1", ResnetBlock(channels, channels));
  attn_1 = register_module("attn_1", AttnBlock(channels));
  block_2 = register_module("block_2", ResnetBlock(channels, channels));
}

at::Tensor MidImpl::forward(const at::Tensor& x, LayerOps& ops) {
  return block_2->forward(attn_1->forward(block_1->forward(x, ops), ops), ops);
}

ResampleImpl::ResampleImpl(int64_t in_channels, int64_t out_channels, bool temporal, bool up)
    : out_channels_(out_channels), rt_(temporal ? 2 : 1), up_(up) {
  const int64_t factor = rt_ * 4;
  conv = register_module("conv",
                         nn::MakeConv3d(in_channels, up ? out_channels * factor : out_channels / factor, /*kernel=*/3));
}

at::Tensor ResampleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = nn::RunConv3d(ops, conv, x);
  if (up_) {
    const int64_t repeats = rt_ * 4 * out_channels_ / x.size(1);
    return nn::SubpixelMajorDepthToSpace(h, rt_, 2, 2) +
           nn::SubpixelMajorDepthToSpace(x.repeat_interleave(repeats, 1), rt_, 2, 2);
  }
  return nn::SubpixelMajorSpaceToDepth(h, rt_, 2, 2) +
         nn::ChannelGroupMean(nn::SubpixelMajorSpaceToDepth(x, rt_, 2, 2), out_channels_);
}

LevelImpl::LevelImpl(const LevelSpec& spec, bool up) {
  block = register_module("block", torch::nn::ModuleList());
  int64_t in = spec.in_channels;
  for (int64_t i = 0; i < spec.resnets; ++i) {
    block->push_back(ResnetBlock(in, spec.out_channels));
    in = spec.out_channels;
  }
  if (spec.resample) {
    resample = register_module(up ? "upsample" : "downsample", Resample(in, spec.resample_out, spec.temporal, up));
  }
}

at::Tensor LevelImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *block) h = resnet->as<ResnetBlockImpl>()->forward(h, ops);
  return resample ? resample->forward(h, ops) : h;
}

Decoder3DImpl::Decoder3DImpl(const HunyuanImage3Config& c) : conv_in_repeats_(c.conv_in_repeats()) {
  const std::vector<int64_t> widths = c.decoder_widths();
  conv_in = register_module("conv_in", nn::MakeConv3d(c.latent_channels, widths.front(), 3));
  mid = register_module("mid", Mid(widths.front()));
  up = register_module("up", torch::nn::ModuleList());
  int64_t width = widths.front();
  for (const LevelSpec& l : c.DecoderLevels()) {
    up->push_back(Level(l, /*up=*/true));
    width = l.resample ? l.resample_out : l.out_channels;
  }
  norm_out = register_module("norm_out", nn::MakeGroupNorm(kGroups, width, kEps));
  conv_out = register_module("conv_out", nn::MakeConv3d(width, c.out_channels, 3));
}

at::Tensor Decoder3DImpl::forward(const at::Tensor& z, LayerOps& ops) {
  at::Tensor h = nn::RunConv3d(ops, conv_in, z) + z.repeat_interleave(conv_in_repeats_, 1);
  h = mid->forward(h, ops);
  for (const auto& level : *up) h = level->as<LevelImpl>()->forward(h, ops);
  return nn::RunConv3d(ops, conv_out, Swish(nn::RunGroupNorm(ops, norm_out, h)));
}

Encoder3DImpl::Encoder3DImpl(const HunyuanImage3Config& c) : latent_channels_(c.latent_channels) {
  conv_in = register_module("conv_in", nn::MakeConv3d(c.in_channels, c.block_out_channels.front(), 3));
  down = register_module("down", torch::nn::ModuleList());
  for (const LevelSpec& l : c.EncoderLevels()) down->push_back(Level(l, /*up=*/false));
  const int64_t width = c.encoder_width();
  mid = register_module("mid", Mid(width));
  norm_out = register_module("norm_out", nn::MakeGroupNorm(kGroups, width, kEps));
  conv_out = register_module("conv_out", nn::MakeConv3d(width, 2 * c.latent_channels, 3));
}

at::Tensor Encoder3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = nn::RunConv3d(ops, conv_in, x);
  for (const auto& level : *down) h = level->as<LevelImpl>()->forward(h, ops);
  h = mid->forward(h, ops);
  const at::Tensor shortcut = nn::ChannelGroupMean(h, 2 * latent_channels_);
  return nn::RunConv3d(ops, conv_out, Swish(nn::RunGroupNorm(ops, norm_out, h))) + shortcut;
}

}  // namespace vaedecode::families::hunyuanimage3
