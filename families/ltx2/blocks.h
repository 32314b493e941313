#pragma once

// LibTorch mirrors of the diffusers blocks AutoencoderKLLTX2Video's decoder and
// encoder are built from (autoencoders/autoencoder_kl_ltx2.py). Children are registered
// under the diffusers attribute names, so named_parameters() equals the
// diffusers state-dict keys (decoder.up_blocks.0.upsamplers.0.conv.conv.weight).
//
// Row-coupled ops are the 3x3x3 convs only, run through LayerOps with the
// configured spatial padding (zeros, reflect or replicate) applied inside the
// conv, so interior band edges read the neighbours' rows. Time is never
// sharded: its replicate padding (causal or centred) happens here, before
// ops.Conv. PerChannelRMSNorm, the LayerNorm of a widening resnet, SiLU, the
// timestep modulation and the depth-to-space upsampler are local to a row
// band (depth-to-space turns each row into stride_h rows).
//
// How AutoencoderKLLTX2Video's decoder shards by rows (exact mode), with
// height as the sharded axis of every activation:
//  - every 3x3x3 conv is stride 1 with a centred kernel and its spatial
//    padding (zeros, reflect or replicate) inside the conv: halo convolution
//    of radius 1, the layer's padding applied only at the global top and
//    bottom, neighbours' real rows at interior edges. Reflect at a global edge
//    reads rows 1..pad, which the edge band plus its one-sided halo always
//    holds (band + halo >= pad + 1 whenever band >= halo), so reflect needs no
//    more than zeros does; the dense decode itself needs height >= 2;
//  - 1x1x1 conv_shortcuts: no halo;
//  - temporal padding (replicated first/last frames) is local: every rank
//    holds the whole temporal sequence of its band;
//  - PerChannelRMSNorm, the LayerNorm of a widening resnet, SiLU, the
//    timestep modulation: per pixel, local;
//  - the depth-to-space upsamplers and the final unpatchify: local, each row
//    becomes stride_h (or patch_size) rows, so bands scale uniformly;
//  - no GroupNorm and no attention: the decode's only collectives are the
//    halo exchanges and the final row gather.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution.
//
// The encoder shards the same way, bands cut in whole latent rows at every
// row level (LTX2Encoder::RowLevels): its 3x3x3 convs are halo convolutions;
// the patchify and the folding downsamplers' space-to-depth (conv then fold,
// and the residual's group mean) turn each band's rows into rows/stride_h
// rows locally; a "conv" downsampler is a stride-2 halo convolution; its
// norms are per pixel. Halo exchanges are again its only collectives.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/layer_ops.h"
#include "families/ltx2/config.h"
#include "families/nn/modules.h"

namespace vaedecode::families::ltx2 {

// diffusers PerChannelRMSNorm: x / sqrt(mean_c(x²) + eps), no parameters.
at::Tensor PerChannelRMSNorm(const at::Tensor& x, double eps = 1e-8);  // [B, C, ...] -> same

// diffusers LTX2VideoCausalConv3d: a Conv3d ("conv") with spatial padding k//2
// in `mode` inside the conv, and temporal padding by repeating the first frame
// k-1 times (causal) or the first and last frames (k-1)/2 times each. With
// `stride` 2 (the encoder's "conv" downsampler) it strides all three axes.
class LTX2VideoCausalConv3dImpl : public torch::nn::Module {
 public:
  LTX2VideoCausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel, PaddingMode mode,
                            int64_t stride = 1);
  // [B, C, T, H, W] -> [B, C', T, H, W] (stride 1) or [B, C', ⌈T/2⌉, ⌈H/2⌉, ⌈W/2⌉]
  // `stream`: a causal decode's chunk, its frames before it kept there.
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, bool causal, nn::CausalFrames* stream = nullptr);

  torch::nn::Conv3d conv{nullptr};

 private:
  PaddingMode mode_;
  int64_t stride_;
};
TORCH_MODULE(LTX2VideoCausalConv3d);

// diffusers TimestepEmbedding(256, dim): linear_1, SiLU, linear_2.
class TimestepEmbeddingImpl : public torch::nn::Module {
 public:
  TimestepEmbeddingImpl(int64_t in_channels, int64_t embedding_dim);
  at::Tensor forward(const at::Tensor& x);  // [B, 256] -> [B, dim]

  torch::nn::Linear linear_1{nullptr};
  torch::nn::Linear linear_2{nullptr};
};
TORCH_MODULE(TimestepEmbedding);

// diffusers PixArtAlphaCombinedTimestepSizeEmbeddings(dim, 0) as the LTX-2
// decoder uses it (no additional conditions): the sinusoidal projection of
// the timestep to 256 channels, then `timestep_embedder`.
class TimestepEmbedderImpl : public torch::nn::Module {
 public:
  explicit TimestepEmbedderImpl(int64_t embedding_dim);
  at::Tensor forward(const at::Tensor& timestep, at::ScalarType dtype);  // [B] -> [B, dim] in dtype

  TimestepEmbedding timestep_embedder{nullptr};
};
TORCH_MODULE(TimestepEmbedder);

// The sinusoidal part: diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True,
// downscale_freq_shift=0). [B] -> [B, dim] in fp32.
at::Tensor SinusoidalTimestepEmbedding(const at::Tensor& timestep, int64_t dim);

// diffusers LTX2VideoResnetBlock3d (inject_noise false, dropout inactive).
class LTX2VideoResnetBlock3dImpl : public torch::nn::Module {
 public:
  LTX2VideoResnetBlock3dImpl(int64_t in_channels, int64_t out_channels, double eps, bool timestep_conditioning,
                             PaddingMode mode);
  // `temb`: [B, 4·C_in, 1, 1, 1] when timestep-conditioned, else undefined.
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& temb, bool causal,
                     nn::CausalFrames* stream = nullptr);

  LTX2VideoCausalConv3d conv1{nullptr};
  LTX2VideoCausalConv3d conv2{nullptr};
  torch::nn::LayerNorm norm3{nullptr};       // only when widths differ
  torch::nn::Conv3d conv_shortcut{nullptr};  // 1x1x1, only when widths differ
  at::Tensor scale_shift_table;              // [4, C_in], timestep conditioning only
};
TORCH_MODULE(LTX2VideoResnetBlock3d);

// diffusers LTX2VideoUpsampler3d: a 3x3x3 conv to C·st·sh·sw / upscale_factor
// channels, depth-to-space by (st, sh, sw), the first st-1 frames dropped; with
// `residual`, plus the input folded the same way and its channels repeated.
class LTX2VideoUpsampler3dImpl : public torch::nn::Module {
 public:
  LTX2VideoUpsampler3dImpl(int64_t in_channels, std::vector<int64_t> stride, bool residual, int64_t upscale_factor,
                           PaddingMode mode);
  // [B, C, T, H, W] -> [B, C / upscale_factor, T·st - (st-1), H·sh, W·sw]
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, bool causal, nn::CausalFrames* stream = nullptr);

  LTX2VideoCausalConv3d conv{nullptr};

 private:
  std::vector<int64_t> stride_;
  bool residual_;
  int64_t upscale_factor_;
};
TORCH_MODULE(LTX2VideoUpsampler3d);

// diffusers LTX2VideoMidBlock3d.
class LTX2VideoMidBlock3dImpl : public torch::nn::Module {
 public:
  LTX2VideoMidBlock3dImpl(int64_t channels, int64_t num_layers, double eps, bool timestep_conditioning,
                          PaddingMode mode);
  // `timestep`: [B] (already scaled by the decoder) when conditioned, else undefined.
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& timestep, bool causal,
                     nn::CausalFrames* stream = nullptr);

  TimestepEmbedder time_embedder{nullptr};  // timestep conditioning only
  torch::nn::ModuleList resnets{nullptr};
};
TORCH_MODULE(LTX2VideoMidBlock3d);

// diffusers LTX2VideoUpBlock3d: an optional widening resnet (conv_in), the
// optional upsampler, then the resnets.
class LTX2VideoUpBlock3dImpl : public torch::nn::Module {
 public:
  LTX2VideoUpBlock3dImpl(const UpBlockSpec& spec, double eps, bool timestep_conditioning, PaddingMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& timestep, bool causal,
                     nn::CausalFrames* stream = nullptr);

  TimestepEmbedder time_embedder{nullptr};    // timestep conditioning only
  LTX2VideoResnetBlock3d conv_in{nullptr};    // only when widths differ
  torch::nn::ModuleList upsamplers{nullptr};  // absent without spatio-temporal scaling
  torch::nn::ModuleList resnets{nullptr};
};
TORCH_MODULE(LTX2VideoUpBlock3d);

// diffusers LTX2VideoDownsampler3d: the first st-1 frames repeated in front,
// a 3x3x3 conv to C_out / (st·sh·sw) channels folded space-to-depth by
// (st, sh, sw), plus the input folded the same way and averaged over groups
// of C_in·st·sh·sw / C_out channels.
class LTX2VideoDownsampler3dImpl : public torch::nn::Module {
 public:
  LTX2VideoDownsampler3dImpl(int64_t in_channels, int64_t out_channels, std::vector<int64_t> stride, PaddingMode mode);
  // [B, C, T, H, W] -> [B, C_out, (T + st - 1) / st, H / sh, W / sw]
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, bool causal);

  LTX2VideoCausalConv3d conv{nullptr};

 private:
  std::vector<int64_t> stride_;
  int64_t group_size_;
};
TORCH_MODULE(LTX2VideoDownsampler3d);

// diffusers LTX2VideoDownBlock3D: the resnets, then the optional downsampler
// (a folding LTX2VideoDownsampler3d, or a stride-2 conv for "conv").
class LTX2VideoDownBlock3DImpl : public torch::nn::Module {
 public:
  LTX2VideoDownBlock3DImpl(const DownBlockSpec& spec, double eps, PaddingMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, bool causal);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};  // absent without spatio-temporal scaling
};
TORCH_MODULE(LTX2VideoDownBlock3D);

// diffusers LTX2VideoEncoder3d: patchify, conv_in, the down blocks, the mid
// block, RMS norm, SiLU, conv_out to latent_channels + 1, whose last channel
// is the log-variance of every latent channel.
class LTX2VideoEncoder3dImpl : public torch::nn::Module {
 public:
  explicit LTX2VideoEncoder3dImpl(const LTX2Config& config);  // config.CheckEncoder() passed
  // [B, in_channels, T, H, W] -> moments [B, 2·latent_channels, T', H / s, W / s]:
  // the mean, then the shared log-variance repeated, as diffusers concatenates them.
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);

  LTX2VideoCausalConv3d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  LTX2VideoMidBlock3d mid_block{nullptr};
  LTX2VideoCausalConv3d conv_out{nullptr};

 private:
  bool causal_;
  int64_t patch_size_;
};
TORCH_MODULE(LTX2VideoEncoder3d);

// diffusers LTX2VideoDecoder3d, ending in the unpatchify to pixels.
class LTX2VideoDecoder3dImpl : public torch::nn::Module {
 public:
  explicit LTX2VideoDecoder3dImpl(const LTX2Config& config);
  // z: [B, latent_channels, T, h, w]; `timestep`: [B] when conditioned.
  // -> [B, out_channels, 1 + tf·(T-1), h·s, w·s]
  // `stream` (a causal decoder's): z is the clip's next chunk, the causal
  // convs' frames before it kept there.
  at::Tensor forward(const at::Tensor& z, LayerOps& ops, const at::Tensor& timestep,
                     nn::CausalFrames* stream = nullptr);

  LTX2VideoCausalConv3d conv_in{nullptr};
  LTX2VideoMidBlock3d mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  LTX2VideoCausalConv3d conv_out{nullptr};
  // Timestep conditioning only:
  at::Tensor timestep_scale_multiplier;  // [] (1000 at init)
  TimestepEmbedder time_embedder{nullptr};
  at::Tensor scale_shift_table;  // [2, C]

 private:
  bool causal_;
  int64_t patch_size_;
};
TORCH_MODULE(LTX2VideoDecoder3d);

}  // namespace vaedecode::families::ltx2
