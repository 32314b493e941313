#pragma once

// Building blocks more than one family's modules use: LibTorch modules made
// as diffusers makes them, their parameters run through LayerOps (so the
// same module decodes densely or as a row band), and the row-local
// reshapes. A family borrows these, never another family's blocks.

#include <cstdint>
#include <map>
#include <set>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/layer_ops.h"

namespace vaedecode::families::nn {

// nn.Conv2d(in, out, kernel, padding=(kernel - 1) / 2): stride 1, "same".
torch::nn::Conv2d MakeConv2d(int64_t in, int64_t out, int64_t kernel);
// nn.GroupNorm(groups, channels, eps, affine=True).
torch::nn::GroupNorm MakeGroupNorm(int64_t groups, int64_t channels, double eps);

// A stride-1, odd-kernel, "same"-padded 2-D conv module through `ops`.
at::Tensor RunConv2d(LayerOps& ops, const torch::nn::Conv2dImpl& conv, const at::Tensor& x);
inline at::Tensor RunConv2d(LayerOps& ops, const torch::nn::Conv2d& conv, const at::Tensor& x) {
  return RunConv2d(ops, *conv, x);
}
// nn.Conv3d(in, out, kernel, padding=(kernel - 1) / 2): stride 1, "same",
// zero padding on both sides of T, H and W (not causal).
torch::nn::Conv3d MakeConv3d(int64_t in, int64_t out, int64_t kernel);
// Such a conv module through `ops` (time is padded, never sharded).
at::Tensor RunConv3d(LayerOps& ops, const torch::nn::Conv3dImpl& conv, const at::Tensor& x);
inline at::Tensor RunConv3d(LayerOps& ops, const torch::nn::Conv3d& conv, const at::Tensor& x) {
  return RunConv3d(ops, *conv, x);
}

// A GroupNorm module through `ops` (merged statistics when sharded).
at::Tensor RunGroupNorm(LayerOps& ops, const torch::nn::GroupNorm& norm, const at::Tensor& x);

// diffusers' WanRMS_norm / HunyuanVideo15RMS_norm (no bias): F.normalize
// over channels · √C · gamma, reduced precision normalised in fp32. Local to
// a row band (channels only). `images`: gamma is [C, 1, 1] (for [N, C, H, W])
// instead of [C, 1, 1, 1].
class ChannelRMSNormImpl : public torch::nn::Module {
 public:
  ChannelRMSNormImpl(int64_t dim, bool images);
  at::Tensor forward(const at::Tensor& x);  // [B, C, ...] -> same

  at::Tensor gamma;

 private:
  double scale_;
};
TORCH_MODULE(ChannelRMSNorm);

// The HunyuanVideo lineage's causal conv3d (HunyuanVideoCausalConv3d,
// HunyuanVideo15CausalConv3d; stride 1): "conv" after replicate padding,
// k-1 frames in front in time and k//2 per side in H and W. The temporal
// half is done here (time is never sharded); the spatial half is the conv's
// own ConvGeometry, so a sharded conv replicates only at the global top and
// bottom and reads the neighbours' rows at interior band edges.
//
// A stream (a clip decoded chunk by chunk) passes `frames`: the conv's
// k-1 frames in front are then the last ones of its input so far (the clip's
// first chunk still replicates its first frame), so the chunks' outputs are
// the whole clip's.
class CausalFrames;
class ReplicateCausalConv3dImpl : public torch::nn::Module {
 public:
  ReplicateCausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel);
  // [B, C, T, H, W] -> [B, C', T, H, W]
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, CausalFrames* frames = nullptr);

  torch::nn::Conv3d conv{nullptr};
};
TORCH_MODULE(ReplicateCausalConv3d);

// What a stream's causal layers keep between chunks: for each layer (by its
// address), the last frames of its temporally padded input.
class CausalFrames {
 public:
  // `x` with the `keep` frames before it: those `layer` kept from the
  // previous chunk, or at the clip's start `keep` copies of its first frame;
  // keeps the last `keep` frames of the result for the next chunk.
  at::Tensor Extend(const void* layer, const at::Tensor& x, int64_t keep);
  // Whether the calls to come are the clip's last (then Extend keeps
  // nothing: no chunk follows to need it, and what was kept is freed).
  void set_clip_ends(bool ends) { clip_ends_ = ends; }
  bool clip_ends() const { return clip_ends_; }
  // Whether `layer`'s input this time begins the clip (the first call for
  // it): a temporal upsampler treats the clip's first frame apart.
  bool AtClipStart(const void* layer) { return past_start_.insert(layer).second; }
  int64_t bytes() const;

 private:
  std::map<const void*, at::Tensor> kept_;
  std::set<const void*> past_start_;
  bool clip_ends_ = false;
};

// F.interpolate(x, scale_factor=..., mode="nearest"): [B, C, H, W] by
// `factor_s` in H and W (`factor_t` must be 1), or [B, C, T, H, W] by
// `factor_t` in T and `factor_s` in H and W. In the input's dtype: diffusers
// casts bfloat16 to float32 around it for old torch releases that had no
// bf16 kernel, and a nearest copy's values are the same either way, so the
// float32 detour (a 4 GiB temporary for a 2048² bf16 decode) is skipped.
// Row-local: each input row becomes `factor_s` rows.
at::Tensor UpsampleNearest(const at::Tensor& x, int64_t factor_t, int64_t factor_s);

// diffusers' unpatchify (Wan, LTX-2): [B, C·P·P, T, H, W] -> [B, C, T, H·P,
// W·P], pixel (c, y·P + dy, x·P + dx) from channel c·P·P + dx·P + dy.
// Row-local: each input row becomes P output rows.
at::Tensor Unpatchify(const at::Tensor& x, int64_t patch_size);
// diffusers' patchify (Wan 2.2's encoder), Unpatchify's inverse:
// [B, C, T, H·P, W·P] -> [B, C·P·P, T, H, W]. Row-local: every P input rows
// become one output row (H and W must be multiples of P).
at::Tensor Patchify(const at::Tensor& x, int64_t patch_size);

// The depth-to-space of the Hunyuan upsamplers (HunyuanImage-2.1,
// HunyuanVideo 1.5), sub-pixel-major rather than torch's pixel_shuffle order:
// [B, rt·rh·rw·C, (T,) H, W] -> [B, C, (T·rt,) H·rh, W·rw], output (c, t·rt +
// dt, y·rh + dy, x·rw + dx) from input channel ((dt·rh + dy)·rw + dx)·C + c.
// `rt` must be 1 for a 4-D x. Row-local: each input row becomes rh rows.
at::Tensor SubpixelMajorDepthToSpace(const at::Tensor& x, int64_t rt, int64_t rh, int64_t rw);
// The mean of [B, C, ...]'s channels in `groups` consecutive groups:
// [B, groups, ...] (the Hunyuan downsamplers' and encoders' shortcuts). Local.
at::Tensor ChannelGroupMean(const at::Tensor& x, int64_t groups);
// SubpixelMajorDepthToSpace's inverse, the Hunyuan downsamplers' space-to-depth: [B, C, (T·rt,)
// H·rh, W·rw] -> [B, rt·rh·rw·C, (T,) H, W]. Row-local: every rh input rows
// become one output row (the sides must be multiples of the factors).
at::Tensor SubpixelMajorSpaceToDepth(const at::Tensor& x, int64_t rt, int64_t rh, int64_t rw);

// BigVGAN's anti-aliased resampling of [B, C, L] signals (diffusers'
// UpSample1d and DownSample1d, MiniMax-H3 audio's and LTX-2's vocoder's):
// depthwise over the channels with a Kaiser-sinc `filter` [1, 1, K] as the
// checkpoint stores it. Up: replicate-pad K/ratio - 1 per side, a transposed
// conv by `ratio` times `ratio`, cropped to ratio·L samples. Down: replicate-
// pad (K/2 + K%2 - 1, K/2), a low-pass conv of stride `ratio`.
at::Tensor AntiAliasUpsample1d(const at::Tensor& x, const at::Tensor& filter, int64_t ratio);
at::Tensor LowPassDownsample1d(const at::Tensor& x, const at::Tensor& filter, int64_t ratio);

// diffusers' SnakeBeta (logscale): x + sin²(e^alpha · x) / (e^beta + 1e-9) per
// channel of [B, C, L]; Snake (use_beta false) divides by e^alpha instead.
class SnakeBetaImpl : public torch::nn::Module {
 public:
  explicit SnakeBetaImpl(int64_t channels, bool use_beta = true);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor alpha, beta;  // beta undefined for Snake
};
TORCH_MODULE(SnakeBeta);

}  // namespace vaedecode::families::nn
