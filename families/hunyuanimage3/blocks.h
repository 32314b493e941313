#pragma once

// LibTorch mirrors of the blocks of HunyuanImage-3.0's AutoencoderKLConv3D
// (release code, hunyuan_image_3/autoencoder_kl_3d.py), children under the
// release's attribute names so named_parameters() equals its state-dict keys
// (decoder.up.0.block.0.conv1.weight, decoder.up.0.upsample.conv.weight,
// decoder.mid.attn_1.q.weight).
//
// Everything is 3-D: 3x3x3 convs with zero padding on both sides of T, H and
// W (not causal), GroupNorm over (C/32, T, H, W), swish. An image is one
// latent frame whose temporal upsamplers make ffactor_temporal frames that
// see each other through every later conv; the last one is the image.
//
// Row-coupled ops run through LayerOps, height being the sharded axis: the
// 3x3x3 convs (halo 1; time is padded locally, never sharded), every
// GroupNorm (merged statistics) and the mid-block attention (local queries,
// gathered K/V over the latent's one frame). The 1x1x1 q/k/v/proj and
// nin_shortcut convs, swish, the channel-repeat and group-mean shortcuts and
// the DCAE depth-to-space / space-to-depth are local to a band (bands are
// cut in whole latent rows).

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/hunyuanimage3/config.h"
#include "families/layer_ops.h"

namespace vaedecode::families::hunyuanimage3 {

// The release's ResnetBlock (a 1x1x1 nin_shortcut when the width changes).
class ResnetBlockImpl : public torch::nn::Module {
 public:
  ResnetBlockImpl(int64_t in_channels, int64_t out_channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, in, T, H, W] -> [B, out, T, H, W]

  torch::nn::GroupNorm norm1{nullptr};
  torch::nn::Conv3d conv1{nullptr};
  torch::nn::GroupNorm norm2{nullptr};
  torch::nn::Conv3d conv2{nullptr};
  torch::nn::Conv3d nin_shortcut{nullptr};
};
TORCH_MODULE(ResnetBlock);

// The release's AttnBlock: one head over every T·H·W token, 1x1x1 q/k/v and
// proj_out, residual.
class AttnBlockImpl : public torch::nn::Module {
 public:
  explicit AttnBlockImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv3d q{nullptr};
  torch::nn::Conv3d k{nullptr};
  torch::nn::Conv3d v{nullptr};
  torch::nn::Conv3d proj_out{nullptr};
};
TORCH_MODULE(AttnBlock);

// The release's `mid`: block_1, attn_1, block_2.
class MidImpl : public torch::nn::Module {
 public:
  explicit MidImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  ResnetBlock block_1{nullptr};
  AttnBlock attn_1{nullptr};
  ResnetBlock block_2{nullptr};
};
TORCH_MODULE(Mid);

// UpsampleDCAE: a 3x3x3 conv to r·out channels shuffled (rt, 2, 2)
// sub-pixel-major (rt = 2 when it doubles time), plus the input's channels
// repeated to r·out and shuffled the same way. DownsampleDCAE: a 3x3x3 conv
// to out/r channels space-to-depth'd (rt, 2, 2), plus the input
// space-to-depth'd the same way and averaged down to `out` channel groups.
class ResampleImpl : public torch::nn::Module {
 public:
  ResampleImpl(int64_t in_channels, int64_t out_channels, bool temporal, bool up);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::Conv3d conv{nullptr};

 private:
  int64_t out_channels_;
  int64_t rt_;
  bool up_;
};
TORCH_MODULE(Resample);

// `decoder.up.<i>` / `encoder.down.<i>`: its resnets (`block`), then the
// optional resampler (`upsample` / `downsample`).
class LevelImpl : public torch::nn::Module {
 public:
  LevelImpl(const LevelSpec& spec, bool up);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::ModuleList block{nullptr};
  Resample resample{nullptr};  // registered as "upsample" or "downsample"
};
TORCH_MODULE(Level);

// The release's Decoder: z [B, Cz, T, h, w] -> [B, out, T·decoded_frames, h·s, w·s].
class Decoder3DImpl : public torch::nn::Module {
 public:
  explicit Decoder3DImpl(const HunyuanImage3Config& config);
  at::Tensor forward(const at::Tensor& z, LayerOps& ops);

  torch::nn::Conv3d conv_in{nullptr};
  Mid mid{nullptr};
  torch::nn::ModuleList up{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  torch::nn::Conv3d conv_out{nullptr};

 private:
  int64_t conv_in_repeats_;
};
TORCH_MODULE(Decoder3D);

// The release's Encoder: [B, in, T, H, W] -> moments [B, 2·Cz, T', H/s, W/s],
// its output adding the last width's channel groups averaged.
class Encoder3DImpl : public torch::nn::Module {
 public:
  explicit Encoder3DImpl(const HunyuanImage3Config& config);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  torch::nn::Conv3d conv_in{nullptr};
  torch::nn::ModuleList down{nullptr};
  Mid mid{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  torch::nn::Conv3d conv_out{nullptr};

 private:
  int64_t latent_channels_;
};
TORCH_MODULE(Encoder3D);

}  // namespace vaedecode::families::hunyuanimage3
