#pragma once

// LibTorch mirrors of the diffusers blocks AutoencoderKLWan's decoder is built
// from (autoencoders/autoencoder_kl_wan.py); AutoencoderKLQwenImage's decoder
// blocks are the same classes renamed. Children are registered under the
// diffusers attribute names, so named_parameters() equals the diffusers
// state-dict keys.
//
// diffusers decodes one latent frame ("chunk") at a time; causal convolutions
// see earlier chunks only through a feature cache of their last input frames.
// The cache is explicit state (FeatureCache), owned by one Decode call.
//
// Row-coupled ops (every spatial conv, the mid-block attention) run through
// LayerOps, with height as the sharded axis (dim -2). Time is never sharded:
// causal temporal padding and the cache concatenation happen here, before
// ops.Conv sees a tensor with no temporal padding left to do. RMS norms,
// nearest upsampling and the channel/time reshuffles are local to a row band.
//
// How the Wan-lineage decoders (Wan 2.1, Wan 2.2, Qwen-Image) shard by rows
// (exact mode), with height as the sharded axis of every activation:
//  - every spatial conv (the 3x3x3 causal convs, the upsamplers' 3x3 convs)
//    is stride 1 with a centred kernel and zero padding: halo convolution,
//    halo 1; the (3,1,1) time_conv and the 1x1(x1) convs need no halo;
//  - causal temporal padding and the feature cache are local: every rank
//    holds the whole temporal sequence of its band and runs diffusers' chunk
//    protocol unchanged (one latent frame at a time);
//  - the mid-block attention, per frame: local Q, all-gathered K/V;
//  - RMS norms (over channels), SiLU, residual adds: local;
//  - nearest 2x upsampling, DupUp3D and the final unpatchify: local, each
//    input row becomes 2 (or P) output rows, so bands scale uniformly.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution (bands only grow from there).

#include <array>
#include <cstdint>
#include <deque>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "families/layer_ops.h"
#include "families/nn/modules.h"
#include "families/wan/config.h"

namespace vaedecode::families::wan {

// diffusers' feat_map/feat_idx: one slot per cached layer, visited in the
// same order in every chunk. A slot is empty before the first chunk reaches
// it, "Rep" for a temporal upsampler that has seen only the first chunk, or
// holds the layer's last (at most 2) input frames.
class FeatureCache {
 public:
  struct Slot {
    enum class State { kEmpty, kRepeat, kFrames };
    State state = State::kEmpty;
    at::Tensor frames;  // [B, C, <=2, H, W] when kFrames
  };

  // Starts a chunk: the next layer gets the first slot again.
  void BeginChunk() { next_ = 0; }
  // The slot of the next cached layer (created on the first chunk). The
  // reference stays valid for the cache's lifetime.
  Slot& Next();
  // Slots visited in the current chunk / in total.
  size_t used() const { return next_; }
  size_t size() const { return slots_.size(); }

 private:
  std::deque<Slot> slots_;
  size_t next_ = 0;
};

// diffusers WanCausalConv3d: a Conv3d whose temporal padding is causal
// (2·padding_t zero frames in front, none behind), reduced by the cached
// frames of the previous chunk when there are any.
class WanCausalConv3dImpl : public torch::nn::Conv3dImpl {
 public:
  WanCausalConv3dImpl(int64_t in_channels, int64_t out_channels, std::array<int64_t, 3> kernel,
                      std::array<int64_t, 3> padding);
  // x: [B, C, T, H, W]; `cache`: frames that precede x (undefined: zeros).
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& cache = at::Tensor());

  // Runs the conv the way diffusers' decoder blocks do with a feature cache:
  // consumes one slot, pads with its frames, leaves x's last 2 frames there.
  at::Tensor ForwardCached(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

 private:
  int64_t causal_pad_t_;  // frames of zeros in front without a cache
  int64_t pad_h_;
  int64_t pad_w_;
};
TORCH_MODULE(WanCausalConv3d);

// diffusers WanResidualBlock (dropout inactive in eval).
class WanResidualBlockImpl : public torch::nn::Module {
 public:
  WanResidualBlockImpl(int64_t in_dim, int64_t out_dim);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);  // [B, C, T, H, W] -> [B, C', T, H, W]

  nn::ChannelRMSNorm norm1{nullptr};
  WanCausalConv3d conv1{nullptr};
  nn::ChannelRMSNorm norm2{nullptr};
  WanCausalConv3d conv2{nullptr};
  WanCausalConv3d conv_shortcut{nullptr};  // 1x1x1, only when widths differ
};
TORCH_MODULE(WanResidualBlock);

// diffusers WanAttentionBlock: single-head self-attention within each frame
// over its H·W tokens, 1x1 convs for qkv and the projection, plus residual.
class WanAttentionBlockImpl : public torch::nn::Module {
 public:
  explicit WanAttentionBlockImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops);  // [B, C, T, H, W] -> same

  nn::ChannelRMSNorm norm{nullptr};
  torch::nn::Conv2d to_qkv{nullptr};
  torch::nn::Conv2d proj{nullptr};
};
TORCH_MODULE(WanAttentionBlock);

// diffusers WanMidBlock with one layer: resnet, attention, resnet.
class WanMidBlockImpl : public torch::nn::Module {
 public:
  explicit WanMidBlockImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  torch::nn::ModuleList attentions{nullptr};
  torch::nn::ModuleList resnets{nullptr};
};
TORCH_MODULE(WanMidBlock);

// diffusers WanUpsample: nearest 2x of [N, C, H, W], computed in fp32 as
// diffusers does ("nearest-exact" and "nearest" agree at scale 2). No parameters.
class WanUpsampleImpl : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& x);  // [N, C, H, W] -> [N, C, 2H, 2W]
};
TORCH_MODULE(WanUpsample);

// diffusers' upsample_mode of a decoder up block.
enum class ResampleMode {
  kNone,        // the last block: no upsampler
  kUpsample2d,  // nearest 2x in space per frame, 3x3 conv
  kUpsample3d,  // time_conv doubling the frames, then as kUpsample2d
};

// diffusers WanResample in its decoder modes: "upsample2d" (nearest 2x per
// frame, 3x3 conv) and "upsample3d" (first a causal (3,1,1) time_conv that
// doubles the frames — except on the first chunk, which stays one frame).
class WanResampleImpl : public torch::nn::Module {
 public:
  // `mode` is kUpsample2d or kUpsample3d.
  WanResampleImpl(int64_t dim, ResampleMode mode, int64_t out_dim);
  // [B, C, T, H, W] -> [B, C', T', 2H, 2W] (T' = 2T with a time_conv, past the first chunk)
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  torch::nn::ModuleList resample{nullptr};  // [0] WanUpsample, [1] Conv2d 3x3
  WanCausalConv3d time_conv{nullptr};       // upsample3d only

 private:
  at::Tensor UpsampleTime(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);
};
TORCH_MODULE(WanResample);

// diffusers DupUp3D: the parameter-free shortcut of WanResidualUpBlock that
// repeats channels into a (factor_t, factor_s, factor_s) depth-to-space.
class DupUp3DImpl : public torch::nn::Module {
 public:
  DupUp3DImpl(int64_t in_channels, int64_t out_channels, int64_t factor_t, int64_t factor_s);
  at::Tensor forward(const at::Tensor& x, bool first_chunk);  // [B, C, T, H, W] -> [B, C', T·ft, H·fs, W·fs]

 private:
  int64_t out_channels_;
  int64_t factor_t_;
  int64_t factor_s_;
  int64_t repeats_;
};
TORCH_MODULE(DupUp3D);

// diffusers WanUpBlock (Wan 2.1; Qwen-Image's QwenImageUpBlock):
// num_res_blocks + 1 resnets, then an optional resampler.
class WanUpBlockImpl : public torch::nn::Module {
 public:
  WanUpBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks, ResampleMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // empty for the last block
};
TORCH_MODULE(WanUpBlock);

// diffusers WanResidualUpBlock (Wan 2.2): as WanUpBlock, but the resampler
// keeps the width and the block adds a DupUp3D shortcut of its input.
class WanResidualUpBlockImpl : public torch::nn::Module {
 public:
  WanResidualUpBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks, ResampleMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache, bool first_chunk);

  torch::nn::ModuleList resnets{nullptr};
  WanResample upsampler{nullptr};  // absent for the last block
  DupUp3D avg_shortcut{nullptr};   // absent for the last block
};
TORCH_MODULE(WanResidualUpBlock);

// diffusers WanDecoder3d (QwenImageDecoder3d), decoding one chunk.
class WanDecoder3dImpl : public torch::nn::Module {
 public:
  explicit WanDecoder3dImpl(const WanConfig& config);
  // One latent frame: [B, z, 1, h, w] -> [B, out_channels, 1 or temporal_factor, h·2^(L-1), w·2^(L-1)].
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache, bool first_chunk);

  WanCausalConv3d conv_in{nullptr};
  WanMidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  nn::ChannelRMSNorm norm_out{nullptr};
  WanCausalConv3d conv_out{nullptr};
};
TORCH_MODULE(WanDecoder3d);

// The decode side of diffusers' AutoencoderKLWan / AutoencoderKLQwenImage:
// `post_quant_conv` and `decoder`, with `_decode`'s chunk loop.
class AutoencoderKLWanImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLWanImpl(const WanConfig& config);
  // z: [B, z_dim, T, h, w] in VAE space -> [B, C, 1 + tf·(T-1), h·s, w·s], clamped to [-1, 1].
  // A fresh feature cache per call: repeat decodes are independent.
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops);

  WanDecoder3d decoder{nullptr};
  WanCausalConv3d post_quant_conv{nullptr};  // 1x1x1

 private:
  int64_t patch_size_;
};
TORCH_MODULE(AutoencoderKLWan);

}  // namespace vaedecode::families::wan
