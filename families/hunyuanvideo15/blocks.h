#pragma once

// LibTorch mirrors of the blocks AutoencoderKLHunyuanVideo15's decoder is
// built from (autoencoders/autoencoder_kl_hunyuanvideo15.py), children under
// the diffusers attribute names so named_parameters() equals the state-dict
// keys (decoder.up_blocks.0.resnets.0.conv1.conv.weight).
//
// Row-coupled ops run through LayerOps, height being the sharded axis: the
// replicate-padded causal 3x3x3 convs (halo 1; nn::ReplicateCausalConv3d)
// and the mid block's frame-causal attention over all T·H·W tokens (local
// queries, every frame's K/V band gathered once). The norms are channel RMS
// norms (local: no statistics to merge), and the 1x1x1 convs, SiLU, the
// channel-repeat shortcuts and the sub-pixel unpacking are local to a band.
// The encoder's downsamplers pack 2x2 (2x2x2) pixels into channels: local
// too, as bands are cut in whole latent rows (even rows at every level).

#include <cstdint>
#include <map>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "families/hunyuanvideo15/config.h"
#include "families/layer_ops.h"
#include "families/nn/modules.h"

namespace vaedecode::families::hunyuanvideo15 {

// What a stream (a clip decoded chunk by chunk: HunyuanVideo15Decoder::OpenStream)
// carries through the decoder from one chunk to the next: the causal convs'
// last input frames, the mid block's attention keys and values of every
// frame so far (every rank's rows, gathered once: its queries attend to all
// of them), and which temporal upsamplers are past the clip's first frame
// (CausalFrames::AtClipStart).
// The decoder's norms are per position, so nothing else couples frames.
// nullptr in the forwards below: the whole clip at once (the encoder).
struct StreamState {
  nn::CausalFrames frames;
  std::map<const void*, std::pair<at::Tensor, at::Tensor>> keys_values;  // [B, 1, T, N, C] each
  int64_t bytes() const;
};

// diffusers HunyuanVideo15ResnetBlock.
class ResnetBlockImpl : public torch::nn::Module {
 public:
  ResnetBlockImpl(int64_t in_channels, int64_t out_channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, StreamState* state = nullptr);

  nn::ChannelRMSNorm norm1{nullptr};
  nn::ReplicateCausalConv3d conv1{nullptr};
  nn::ChannelRMSNorm norm2{nullptr};
  nn::ReplicateCausalConv3d conv2{nullptr};
  torch::nn::Conv3d conv_shortcut{nullptr};  // 1x1x1, only when widths differ
};
TORCH_MODULE(ResnetBlock);

// diffusers HunyuanVideo15AttnBlock: single-head attention over all T·H·W
// tokens with the frame-causal mask, 1x1x1-conv q/k/v/proj_out, residual.
class AttnBlockImpl : public torch::nn::Module {
 public:
  explicit AttnBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, StreamState* state = nullptr);

  nn::ChannelRMSNorm norm{nullptr};
  torch::nn::Conv3d to_q{nullptr};
  torch::nn::Conv3d to_k{nullptr};
  torch::nn::Conv3d to_v{nullptr};
  torch::nn::Conv3d proj_out{nullptr};
};
TORCH_MODULE(AttnBlock);

// diffusers HunyuanVideo15Upsample: a causal conv to 8·out (4·out without
// time) channels unpacked 2x2x2 (2x2), sub-pixel-major, plus the input
// unpacked and channel-repeated; with time, the first frame is unpacked 2x2
// only and keeps the first half of its channels (T -> 2T - 1).
class UpsampleImpl : public torch::nn::Module {
 public:
  UpsampleImpl(int64_t in_channels, int64_t out_channels, bool upsample_time);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, StreamState* state = nullptr);

  nn::ReplicateCausalConv3d conv{nullptr};

 private:
  bool upsample_time_;
  int64_t repeats_;
};
TORCH_MODULE(Upsample);

// diffusers HunyuanVideo15Downsample: a causal conv to out/8 (out/4 without
// time) channels packed 2x2x2 (2x2), sub-pixel-major, plus the input packed
// the same way and averaged down to `out` channel groups; with time, the
// first frame is packed 2x2 only (its conv channels twice, its shortcut
// groups half as large: T -> 1 + (T - 1) / 2).
class DownsampleImpl : public torch::nn::Module {
 public:
  DownsampleImpl(int64_t in_channels, int64_t out_channels, bool downsample_time);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  nn::ReplicateCausalConv3d conv{nullptr};

 private:
  int64_t out_channels_;
  bool downsample_time_;
  int64_t group_size_;
};
TORCH_MODULE(Downsample);

// diffusers HunyuanVideo15DownBlock3D.
class DownBlockImpl : public torch::nn::Module {
 public:
  explicit DownBlockImpl(const DownBlockSpec& spec);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};  // absent without downsampling (diffusers' None)
};
TORCH_MODULE(DownBlock);

// diffusers HunyuanVideo15MidBlock with one layer: resnet, attention, resnet.
class MidBlockImpl : public torch::nn::Module {
 public:
  explicit MidBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, StreamState* state = nullptr);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};
};
TORCH_MODULE(MidBlock);

// diffusers HunyuanVideo15UpBlock3D.
class UpBlockImpl : public torch::nn::Module {
 public:
  explicit UpBlockImpl(const UpBlockSpec& spec);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, StreamState* state = nullptr);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // absent without upsampling (diffusers' None)
};
TORCH_MODULE(UpBlock);

// diffusers HunyuanVideo15Encoder3D (2·latent channels out, plus the last
// width's channel groups averaged).
class Encoder3DImpl : public torch::nn::Module {
 public:
  explicit Encoder3DImpl(const HunyuanVideo15Config& config);
  // [B, in, 1 + tf·k, H, W] -> [B, 2·Cz, 1 + k, H/s, W/s]
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  nn::ReplicateCausalConv3d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  MidBlock mid_block{nullptr};
  nn::ChannelRMSNorm norm_out{nullptr};
  nn::ReplicateCausalConv3d conv_out{nullptr};

 private:
  int64_t group_size_;
};
TORCH_MODULE(Encoder3D);

// diffusers HunyuanVideo15Decoder3D.
class Decoder3DImpl : public torch::nn::Module {
 public:
  explicit Decoder3DImpl(const HunyuanVideo15Config& config);
  // [B, Cz, T, h, w] -> [B, out, 1 + tf·(T - 1), h·s, w·s]; a stream's
  // later chunks -> [B, out, tf·T, h·s, w·s].
  at::Tensor forward(const at::Tensor& z, LayerOps& ops, StreamState* state = nullptr);

  nn::ReplicateCausalConv3d conv_in{nullptr};
  MidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  nn::ChannelRMSNorm norm_out{nullptr};
  nn::ReplicateCausalConv3d conv_out{nullptr};

 private:
  int64_t conv_in_repeats_;
};
TORCH_MODULE(Decoder3D);

}  // namespace vaedecode::families::hunyuanvideo15
