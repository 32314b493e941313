#pragma once

// LibTorch mirrors of the diffusers blocks AutoencoderKL's decoder and
// encoder are built from. Children are registered under the diffusers attribute names, so
// named_parameters() equals the diffusers state-dict keys. Every forward takes
// the LayerOps that runs the row-coupled ops (conv, GroupNorm, attention).
//
// FLUX.2's AutoencoderKLFlux2 and other 2-D decoders reuse these blocks.
//
// How AutoencoderKL's layers shard by rows (exact mode):
//  - every conv is stride 1 with a centred 3x3 (halo 1) or 1x1 (halo 0)
//    kernel and zero padding: halo convolution;
//  - every GroupNorm: merged statistics, one collective;
//  - the mid-block attention: local Q, all-gathered K/V;
//  - SiLU, residual adds, Linear q/k/v/out: local;
//  - nearest 2x upsampling: local, bands double.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution (bands only grow from there).

#include <cstdint>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/layer_ops.h"
#include "families/nn/modules.h"

namespace vaedecode::families::autoencoder_kl {

// diffusers ResnetBlock2D with temb=None, time_embedding_norm "default",
// output_scale_factor 1, dropout inactive (eval).
class ResnetBlock2DImpl : public torch::nn::Module {
 public:
  ResnetBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, H, W] -> [B, C', H, W]

  torch::nn::GroupNorm norm1{nullptr};
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::GroupNorm norm2{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::Conv2d conv_shortcut{nullptr};  // 1x1, only when widths differ
};
TORCH_MODULE(ResnetBlock2D);

// diffusers Attention as built by UNetMidBlock2D for VAEs
// (_from_deprecated_attn_block, residual connection, rescale 1, bias).
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t channels, int64_t head_dim, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, H, W] -> same

  torch::nn::GroupNorm group_norm{nullptr};
  torch::nn::Linear to_q{nullptr};
  torch::nn::Linear to_k{nullptr};
  torch::nn::Linear to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [0]: Linear (diffusers' [1] is Dropout)

 private:
  int64_t heads_;
};
TORCH_MODULE(Attention);

// diffusers UNetMidBlock2D with one layer: resnet, attention (optional), resnet.
class UNetMidBlock2DImpl : public torch::nn::Module {
 public:
  UNetMidBlock2DImpl(int64_t channels, int64_t groups, double eps, bool add_attention);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};  // empty without attention
};
TORCH_MODULE(UNetMidBlock2D);

// diffusers Upsample2D(use_conv=True): nearest 2x, then a 3x3 conv.
class Upsample2DImpl : public torch::nn::Module {
 public:
  explicit Upsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, H, W] -> [B, C, 2H, 2W]

  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

// diffusers UpDecoderBlock2D.
class UpDecoderBlock2DImpl : public torch::nn::Module {
 public:
  UpDecoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, int64_t groups, double eps,
                       bool add_upsample);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // empty for the last block
};
TORCH_MODULE(UpDecoderBlock2D);

// diffusers Downsample2D(use_conv=True, padding=0), the encoder's
// downsampler: zero-pad (0, 1, 0, 1), then a 3x3 conv of stride 2. Sharded,
// a band's last window reads one row of the band below; the padding row is
// the global bottom's alone (LayerOps::StridedConv).
class Downsample2DImpl : public torch::nn::Module {
 public:
  explicit Downsample2DImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, H, W] -> [B, C, (H-2)/2+1, (W-2)/2+1]

  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

// diffusers DownEncoderBlock2D.
class DownEncoderBlock2DImpl : public torch::nn::Module {
 public:
  DownEncoderBlock2DImpl(int64_t in_channels, int64_t out_channels, int64_t num_layers, int64_t groups, double eps,
                         bool add_downsample);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};  // empty for the last block
};
TORCH_MODULE(DownEncoderBlock2D);

}  // namespace vaedecode::families::autoencoder_kl
