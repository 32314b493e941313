#pragma once

// LibTorch mirrors of the diffusers blocks AutoencoderKLHunyuanVideo's decoder
// is built from (autoencoders/autoencoder_kl_hunyuan_video.py). Children are
// registered under the diffusers attribute names, so named_parameters()
// equals the diffusers state-dict keys (decoder.up_blocks.0.resnets.0.conv1.conv.weight).
//
// Row-coupled ops run through LayerOps, height being the sharded axis:
//  - nn::ReplicateCausalConv3d pads with replicate in T (k-1 frames in front),
//    H and W (k//2 per side). The temporal half is done here (time is never
//    sharded); the spatial half is the conv's own ConvGeometry (replicate), so
//    a sharded conv replicates only at the global top and bottom and reads
//    the neighbours' rows at interior band edges.
//  - GroupNorm: statistics over each group's channels and T·H·W.
//  - The mid-block attention over all T·H·W tokens with HunyuanVideo's
//    frame-causal mask: TokenLayout::FrameCausal. Its queries stay on
//    their rank; every frame's K/V band is gathered once. We shard it rather
//    than gather the latent-resolution activations around the whole mid block
//    because attention is the mid block's cost (O((T·H·W)²) per tile, far
//    above its convs at real sizes), and replicating it on every rank would
//    cost each rank the whole of it; sharding costs one K/V gather instead of
//    one activation gather, plus the mid block's own halo/norm collectives.
//    The mask is never built: query frame t simply attends to frames 0..t.
// Nearest upsampling, SiLU and the residual adds are local to a band.
//
// How AutoencoderKLHunyuanVideo's decoder shards by rows (exact mode), with
// height as the sharded axis of every activation:
//  - every causal conv is stride 1 with a centred 3x3x3 (halo 1) or 1x1x1
//    (no halo) kernel, replicate padding in space applied by the conv (only
//    at the global top and bottom; interior edges read neighbours' rows);
//  - temporal padding (the first frame repeated) and the temporal tiles of
//    long latents are local: every rank holds the whole temporal sequence of
//    its band and decodes the same tiles;
//  - every GroupNorm: merged statistics, one collective;
//  - the mid-block attention over T·H·W tokens with the frame-causal mask:
//    local Q, every frame's K/V band in one all-gather (see blocks.h for why
//    it is sharded rather than gathered around the mid block);
//  - SiLU, residual adds, Linear q/k/v/out, nearest upsampling (the first
//    frame in space only), the temporal blend of tiles: local; upsampling
//    doubles every band.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/autoencoder_kl/blocks.h"
#include "families/hunyuanvideo/config.h"
#include "families/layer_ops.h"
#include "families/nn/modules.h"

namespace vaedecode::families::hunyuanvideo {

// diffusers HunyuanVideoResnetBlockCausal3D (dropout inactive).
class HunyuanVideoResnetBlockCausal3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoResnetBlockCausal3DImpl(int64_t in_channels, int64_t out_channels, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::GroupNorm norm1{nullptr};
  nn::ReplicateCausalConv3d conv1{nullptr};
  torch::nn::GroupNorm norm2{nullptr};
  nn::ReplicateCausalConv3d conv2{nullptr};
  nn::ReplicateCausalConv3d conv_shortcut{nullptr};  // 1x1x1, only when widths differ
};
TORCH_MODULE(HunyuanVideoResnetBlockCausal3D);

// diffusers Attention as HunyuanVideoMidBlock3D builds it: AutoencoderKL's
// mid-block attention (single head, GroupNorm, Linear q/k/v/out, residual;
// the parameters and their names are autoencoder_kl::AttentionImpl's) over
// all T·H·W tokens with the frame-causal mask.
class HunyuanVideoAttentionImpl : public autoencoder_kl::AttentionImpl {
 public:
  HunyuanVideoAttentionImpl(int64_t channels, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, T, H, W] -> same
};
TORCH_MODULE(HunyuanVideoAttention);

// diffusers' blend_t, in place: the first min(prev, tile, blend) frames of
// `tile` move linearly from `prev`'s last frames to their own (frame x takes
// x / extent of its own). Temporal windows of both the decode and the encode.
void BlendFramesIntoNext(const at::Tensor& prev, at::Tensor& tile, int64_t blend);

// diffusers HunyuanVideoDownsampleCausal3D: the causal conv (replicate
// padding: 2 first frames in front, 1 row and column each side) with stride
// (2 or 1, 2 or 1, 2 or 1) and no further padding: ceil(T / 2) frames,
// ceil(H / 2) rows. Sharded as a strided convolution (LayerOps::StridedConv:
// a band's windows read one row of the band above).
class HunyuanVideoDownsampleCausal3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoDownsampleCausal3DImpl(int64_t channels, bool downsample_time, bool downsample_space);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  nn::ReplicateCausalConv3d conv{nullptr};  // its weights; the stride is applied here

 private:
  bool downsample_time_;
  bool downsample_space_;
};
TORCH_MODULE(HunyuanVideoDownsampleCausal3D);

// diffusers HunyuanVideoDownBlock3D.
class HunyuanVideoDownBlock3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoDownBlock3DImpl(const DownBlockSpec& spec, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};  // absent without downsampling (diffusers' None)
};
TORCH_MODULE(HunyuanVideoDownBlock3D);

// diffusers HunyuanVideoMidBlock3D with one layer: resnet, attention (optional), resnet.
class HunyuanVideoMidBlock3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoMidBlock3DImpl(int64_t channels, int64_t groups, double eps, bool add_attention);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};  // empty without attention
};
TORCH_MODULE(HunyuanVideoMidBlock3D);

// diffusers HunyuanVideoUpsampleCausal3D: the first frame upsampled in space
// only, the others nearest by (ft, fh, fw), then a causal conv.
class HunyuanVideoUpsampleCausal3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoUpsampleCausal3DImpl(int64_t channels, bool upsample_time, bool upsample_space);
  // [B, C, T, H, W] -> [B, C, 1 + ft·(T-1), fh·H, fw·W]
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  nn::ReplicateCausalConv3d conv{nullptr};

 private:
  int64_t factor_t_;
  int64_t factor_s_;
};
TORCH_MODULE(HunyuanVideoUpsampleCausal3D);

// diffusers HunyuanVideoUpBlock3D.
class HunyuanVideoUpBlock3DImpl : public torch::nn::Module {
 public:
  HunyuanVideoUpBlock3DImpl(const UpBlockSpec& spec, int64_t groups, double eps);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // empty without upsampling
};
TORCH_MODULE(HunyuanVideoUpBlock3D);

// diffusers HunyuanVideoEncoder3D (double_z: 2·latent channels out).
class HunyuanVideoEncoder3DImpl : public torch::nn::Module {
 public:
  explicit HunyuanVideoEncoder3DImpl(const HunyuanVideoConfig& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, in, T, H, W] -> [B, 2·Cz, t, h, w]

  nn::ReplicateCausalConv3d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  HunyuanVideoMidBlock3D mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  nn::ReplicateCausalConv3d conv_out{nullptr};
};
TORCH_MODULE(HunyuanVideoEncoder3D);

// diffusers HunyuanVideoDecoder3D.
class HunyuanVideoDecoder3DImpl : public torch::nn::Module {
 public:
  explicit HunyuanVideoDecoder3DImpl(const HunyuanVideoConfig& config);
  // [B, latent_channels, T, h, w] -> [B, out_channels, 1 + tf·(T-1), h·s, w·s]
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);

  nn::ReplicateCausalConv3d conv_in{nullptr};
  HunyuanVideoMidBlock3D mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  nn::ReplicateCausalConv3d conv_out{nullptr};
};
TORCH_MODULE(HunyuanVideoDecoder3D);

}  // namespace vaedecode::families::hunyuanvideo
