#pragma once

// LibTorch mirrors of the blocks AutoencoderKLHunyuanImage's decoder is built
// from (autoencoders/autoencoder_kl_hunyuanimage.py), children under the
// diffusers attribute names so named_parameters() equals the state-dict keys
// (decoder.up_blocks.6.conv.weight is an upsampler, .0.conv1.weight a resnet).
//
// Row-coupled ops run through LayerOps, height being the sharded axis: the
// 3x3 zero-padded convs (halo 1), every GroupNorm (merged statistics) and the
// mid-block attention (local queries, gathered K/V). The 1x1 q/k/v/proj
// convs, SiLU, the channel-repeat shortcuts and the sub-pixel shuffle are
// local to a band (each latent row becomes two rows).
//
// The encoder shards the same way: its downsamplers are a 3x3 conv (halo 1)
// then a 2x2 space-to-depth of it and of their input, local because bands
// are cut in whole latent rows (an even number of rows at every level).

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/hunyuanimage/config.h"
#include "families/layer_ops.h"

namespace vaedecode::families::hunyuanimage {

// diffusers HunyuanImageResnetBlock with equal widths (the config refuses
// others: diffusers applies conv_shortcut to the conv output, which cannot run).
class ResnetBlockImpl : public torch::nn::Module {
 public:
  explicit ResnetBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::GroupNorm norm1{nullptr};
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::GroupNorm norm2{nullptr};
  torch::nn::Conv2d conv2{nullptr};
};
TORCH_MODULE(ResnetBlock);

// diffusers HunyuanImageAttentionBlock: single-head self-attention over the
// H·W tokens, 1x1-conv q/k/v/proj, residual.
class AttentionBlockImpl : public torch::nn::Module {
 public:
  explicit AttentionBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d to_q{nullptr};
  torch::nn::Conv2d to_k{nullptr};
  torch::nn::Conv2d to_v{nullptr};
  torch::nn::Conv2d proj{nullptr};
};
TORCH_MODULE(AttentionBlock);

// diffusers HunyuanImageUpsample: a 3x3 conv to 4·out channels shuffled 2x2
// (sub-pixel-major), plus the input's channels repeated to 4·out and
// shuffled the same way.
class UpsampleImpl : public torch::nn::Module {
 public:
  UpsampleImpl(int64_t in_channels, int64_t out_channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, in, H, W] -> [B, out, 2H, 2W]

  torch::nn::Conv2d conv{nullptr};

 private:
  int64_t repeats_;
};
TORCH_MODULE(Upsample);

// diffusers HunyuanImageDownsample: a 3x3 conv to out/4 channels
// space-to-depth'd 2x2 (sub-pixel-major), plus the input space-to-depth'd the
// same way and averaged down to `out` channel groups.
class DownsampleImpl : public torch::nn::Module {
 public:
  DownsampleImpl(int64_t in_channels, int64_t out_channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, in, H, W] -> [B, out, H/2, W/2]

  torch::nn::Conv2d conv{nullptr};

 private:
  int64_t out_channels_;
};
TORCH_MODULE(Downsample);

// diffusers HunyuanImageMidBlock with one layer: resnet, attention, resnet.
class MidBlockImpl : public torch::nn::Module {
 public:
  explicit MidBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};
};
TORCH_MODULE(MidBlock);

// diffusers HunyuanImageEncoder2D: its output (2·latent channels) adds the
// last width's channel groups averaged.
class Encoder2DImpl : public torch::nn::Module {
 public:
  explicit Encoder2DImpl(const HunyuanImageConfig& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, in, H, W] -> [B, 2·Cz, H/s, W/s]

  torch::nn::Conv2d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};  // resnets and downsamplers, one flat list
  MidBlock mid_block{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};

 private:
  int64_t group_size_;
};
TORCH_MODULE(Encoder2D);

// diffusers HunyuanImageDecoder2D.
class Decoder2DImpl : public torch::nn::Module {
 public:
  explicit Decoder2DImpl(const HunyuanImageConfig& config);
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);  // [B, Cz, h, w] -> [B, out, h·s, w·s]

  torch::nn::Conv2d conv_in{nullptr};
  MidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};  // resnets and upsamplers, one flat list
  torch::nn::GroupNorm norm_out{nullptr};
  torch::nn::Conv2d conv_out{nullptr};

 private:
  int64_t conv_in_repeats_;
};
TORCH_MODULE(Decoder2D);

}  // namespace vaedecode::families::hunyuanimage
