#include "families/hunyuanvideo15/blocks.h"

#include <tuple>

#include <ATen/ATen.h>

namespace vaedecode::families::hunyuanvideo15 {
namespace {

torch::nn::Conv3d MakePointwiseConv3d(int64_t in, int64_t out) {
  return torch::nn::Conv3d(torch::nn::Conv3dOptions(in, out, 1));
}

at::Tensor RunPointwise(LayerOps& ops, const torch::nn::Conv3d& conv, const at::Tensor& x) {
  return ops.Conv(x, conv->weight, conv->bias, ConvGeometry{});
}

// The stream's kept frames, or none (the whole clip).
nn::CausalFrames* FramesOf(StreamState* state) { return state != nullptr ? &state->frames : nullptr; }

}  // namespace

int64_t StreamState::bytes() const {
  int64_t total = frames.bytes();
  for (const auto& [layer, kv] : keys_values) total += kv.first.nbytes() + kv.second.nbytes();
  return total;
}

ResnetBlockImpl::ResnetBlockImpl(int64_t in_channels, int64_t out_channels) {
  norm1 = register_module("norm1", nn::ChannelRMSNorm(in_channels, /*images=*/false));
  conv1 = register_module("conv1", nn::ReplicateCausalConv3d(in_channels, out_channels, 3));
  norm2 = register_module("norm2", nn::ChannelRMSNorm(out_channels, /*images=*/false));
  conv2 = register_module("conv2", nn::ReplicateCausalConv3d(out_channels, out_channels, 3));
  if (in_channels != out_channels) {
    conv_shortcut = register_module("conv_shortcut", MakePointwiseConv3d(in_channels, out_channels));
  }
}

at::Tensor ResnetBlockImpl::forward(const at::Tensor& x, LayerOps& ops, StreamState* state) {
  at::Tensor h = conv1->forward(at::silu(norm1->forward(x)), ops, FramesOf(state));
  h = conv2->forward(at::silu(norm2->forward(h)), ops, FramesOf(state));
  return h + (conv_shortcut ? RunPointwise(ops, conv_shortcut, x) : x);
}

AttnBlockImpl::AttnBlockImpl(int64_t channels) {
  norm = register_module("norm", nn::ChannelRMSNorm(channels, /*images=*/false));
  to_q = register_module("to_q", MakePointwiseConv3d(channels, channels));
  to_k = register_module("to_k", MakePointwiseConv3d(channels, channels));
  to_v = register_module("to_v", MakePointwiseConv3d(channels, channels));
  proj_out = register_module("proj_out", MakePointwiseConv3d(channels, channels));
}

at::Tensor AttnBlockImpl::forward(const at::Tensor& x, LayerOps& ops, StreamState* state) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  const at::Tensor normed = norm->forward(x);
  // [B, C, T, H, W] -> [B, 1, T, H·W, C]: one head, each frame's pixels
  // row-major (a band's tokens are contiguous within each frame).
  auto tokens = [&](const torch::nn::Conv3d& conv) {
    return RunPointwise(ops, conv, normed).permute({0, 2, 3, 4, 1}).reshape({b, 1, t, h * w, c});
  };
  at::Tensor keys = tokens(to_k), values = tokens(to_v);
  TokenLayout layout = TokenLayout::FrameCausal(w);  // the whole clip (the encoder)
  if (state != nullptr) {
    // A stream's queries attend to every frame so far. The new frames' keys
    // and values are gathered from every rank once and kept so (the whole
    // clip's exact decode gathers them all too); the earlier ones go in front.
    std::tie(keys, values) = ops.GatherKeysValues(keys, values, w);
    auto [it, first] = state->keys_values.try_emplace(this);
    layout = TokenLayout::FrameCausal(w, first ? 0 : it->second.first.size(2), /*keys_gathered=*/true);
    if (!first) {
      keys = at::cat({it->second.first, keys}, 2);
      values = at::cat({it->second.second, values}, 2);
    }
    if (state->frames.clip_ends()) {
      state->keys_values.erase(it);  // no later frame attends to them
    } else {
      it->second = {keys, values};
    }
  }
  const at::Tensor attended = ops.Attention(tokens(to_q), keys, values, layout);
  const at::Tensor video = attended.reshape({b, t, h, w, c}).permute({0, 4, 1, 2, 3});
  return RunPointwise(ops, proj_out, video) + x;
}

UpsampleImpl::UpsampleImpl(int64_t in_channels, int64_t out_channels, bool upsample_time)
    : upsample_time_(upsample_time), repeats_((upsample_time ? 8 : 4) * out_channels / in_channels) {
  conv = register_module("conv", nn::ReplicateCausalConv3d(in_channels, out_channels * (upsample_time ? 8 : 4), 3));
}

at::Tensor UpsampleImpl::forward(const at::Tensor& x, LayerOps& ops, StreamState* state) {
  const at::Tensor h = conv->forward(x, ops, FramesOf(state));
  // The clip's first frame is special; a stream's later chunks have none.
  const bool clip_start = state == nullptr || state->frames.AtClipStart(this);
  if (upsample_time_ && !clip_start) {
    return nn::SubpixelMajorDepthToSpace(h, 2, 2, 2) +
           nn::SubpixelMajorDepthToSpace(x, 2, 2, 2).repeat_interleave(repeats_, 1);
  }
  if (!upsample_time_) {
    return nn::SubpixelMajorDepthToSpace(h, 1, 2, 2) +
           nn::SubpixelMajorDepthToSpace(x.repeat_interleave(repeats_, 1), 1, 2, 2);
  }
  // The first frame: 2x2 only, half the channels; later frames 2x2x2. The
  // shortcut unpacks first and repeats after (the other order from above).
  const int64_t later = x.size(2) - 1;
  const at::Tensor h_first = nn::SubpixelMajorDepthToSpace(h.narrow(2, 0, 1), 1, 2, 2);
  const at::Tensor h_up = at::cat(
      {h_first.narrow(1, 0, h_first.size(1) / 2), nn::SubpixelMajorDepthToSpace(h.narrow(2, 1, later), 2, 2, 2)}, 2);
  const at::Tensor shortcut =
      at::cat({nn::SubpixelMajorDepthToSpace(x.narrow(2, 0, 1), 1, 2, 2).repeat_interleave(repeats_ / 2, 1),
               nn::SubpixelMajorDepthToSpace(x.narrow(2, 1, later), 2, 2, 2).repeat_interleave(repeats_, 1)},
              2);
  return h_up + shortcut;
}

DownsampleImpl::DownsampleImpl(int64_t in_channels, int64_t out_channels, bool downsample_time)
    : out_channels_(out_channels),
      downsample_time_(downsample_time),
      group_size_((downsample_time ? 8 : 4) * in_channels / out_channels) {
  conv = register_module("conv", nn::ReplicateCausalConv3d(in_channels, out_channels / (downsample_time ? 8 : 4), 3));
}

at::Tensor DownsampleImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor h = conv->forward(x, ops);
  if (!downsample_time_)
    return nn::SubpixelMajorSpaceToDepth(h, 1, 2, 2) +
           nn::ChannelGroupMean(nn::SubpixelMajorSpaceToDepth(x, 1, 2, 2), out_channels_);
  // The first frame alone (2x2, its channels twice), the rest 2x2x2.
  const int64_t t = x.size(2);
  const at::Tensor h_first = nn::SubpixelMajorSpaceToDepth(h.narrow(2, 0, 1), 1, 2, 2);
  const at::Tensor packed =
      at::cat({at::cat({h_first, h_first}, 1), nn::SubpixelMajorSpaceToDepth(h.narrow(2, 1, t - 1), 2, 2, 2)}, 2);
  const at::Tensor shortcut =
      at::cat({nn::ChannelGroupMean(nn::SubpixelMajorSpaceToDepth(x.narrow(2, 0, 1), 1, 2, 2), out_channels_),
               nn::ChannelGroupMean(nn::SubpixelMajorSpaceToDepth(x.narrow(2, 1, t - 1), 2, 2, 2), out_channels_)},
              2);
  return packed + shortcut;
}

DownBlockImpl::DownBlockImpl(const DownBlockSpec& spec) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(ResnetBlock(i == 0 ? spec.in_channels : spec.out_channels, spec.out_channels));
  }
  if (spec.downsample_out_channels > 0) {
    downsamplers = register_module("downsamplers", torch::nn::ModuleList());
    downsamplers->push_back(Downsample(spec.out_channels, spec.downsample_out_channels, spec.downsample_time));
  }
}

at::Tensor DownBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<ResnetBlockImpl>()->forward(h, ops);
  if (downsamplers) h = downsamplers[0]->as<DownsampleImpl>()->forward(h, ops);
  return h;
}

MidBlockImpl::MidBlockImpl(int64_t channels) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(ResnetBlock(channels, channels));
  attentions->push_back(AttnBlock(channels));
  resnets->push_back(ResnetBlock(channels, channels));
}

at::Tensor MidBlockImpl::forward(const at::Tensor& x, LayerOps& ops, StreamState* state) {
  at::Tensor h = resnets[0]->as<ResnetBlockImpl>()->forward(x, ops, state);
  h = attentions[0]->as<AttnBlockImpl>()->forward(h, ops, state);
  return resnets[1]->as<ResnetBlockImpl>()->forward(h, ops, state);
}

UpBlockImpl::UpBlockImpl(const UpBlockSpec& spec) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(ResnetBlock(i == 0 ? spec.in_channels : spec.out_channels, spec.out_channels));
  }
  if (spec.upsample_out_channels > 0) {
    upsamplers = register_module("upsamplers", torch::nn::ModuleList());
    upsamplers->push_back(Upsample(spec.out_channels, spec.upsample_out_channels, spec.upsample_time));
  }
}

at::Tensor UpBlockImpl::forward(const at::Tensor& x, LayerOps& ops, StreamState* state) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<ResnetBlockImpl>()->forward(h, ops, state);
  if (upsamplers) h = upsamplers[0]->as<UpsampleImpl>()->forward(h, ops, state);
  return h;
}

Encoder3DImpl::Encoder3DImpl(const HunyuanVideo15Config& c)
    : group_size_(c.block_out_channels.back() / (2 * c.latent_channels)) {
  conv_in = register_module("conv_in", nn::ReplicateCausalConv3d(c.in_channels, c.block_out_channels.front(), 3));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (const DownBlockSpec& spec : c.DownBlocks()) down_blocks->push_back(DownBlock(spec));
  const int64_t last = c.block_out_channels.back();
  mid_block = register_module("mid_block", MidBlock(last));
  norm_out = register_module("norm_out", nn::ChannelRMSNorm(last, /*images=*/false));
  conv_out = register_module("conv_out", nn::ReplicateCausalConv3d(last, 2 * c.latent_channels, 3));
}

at::Tensor Encoder3DImpl::forward(const at::Tensor& x, LayerOps& ops) {
  at::Tensor h = conv_in->forward(x, ops);
  for (const auto& block : *down_blocks) h = block->as<DownBlockImpl>()->forward(h, ops);
  h = mid_block->forward(h, ops);
  const at::Tensor shortcut = nn::ChannelGroupMean(h, h.size(1) / group_size_);
  return conv_out->forward(at::silu(norm_out->forward(h)), ops) + shortcut;
}

Decoder3DImpl::Decoder3DImpl(const HunyuanVideo15Config& c) : conv_in_repeats_(c.conv_in_repeats()) {
  const std::vector<int64_t> widths = c.decoder_widths();
  conv_in = register_module("conv_in", nn::ReplicateCausalConv3d(c.latent_channels, widths.front(), 3));
  mid_block = register_module("mid_block", MidBlock(widths.front()));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (const UpBlockSpec& spec : c.UpBlocks()) up_blocks->push_back(UpBlock(spec));
  norm_out = register_module("norm_out", nn::ChannelRMSNorm(widths.back(), /*images=*/false));
  conv_out = register_module("conv_out", nn::ReplicateCausalConv3d(widths.back(), c.out_channels, 3));
}

at::Tensor Decoder3DImpl::forward(const at::Tensor& z, LayerOps& ops, StreamState* state) {
  at::Tensor h = conv_in->forward(z, ops, FramesOf(state)) + z.repeat_interleave(conv_in_repeats_, 1);
  h = mid_block->forward(h, ops, state);
  for (const auto& block : *up_blocks) h = block->as<UpBlockImpl>()->forward(h, ops, state);
  return conv_out->forward(at::silu(norm_out->forward(h)), ops, FramesOf(state));
}

}  // namespace vaedecode::families::hunyuanvideo15
