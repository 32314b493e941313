#pragma once

// LibTorch mirrors of the diffusers blocks AutoencoderKLWan's decoder and
// encoder are built from (autoencoders/autoencoder_kl_wan.py);
// AutoencoderKLQwenImage's blocks are the same classes renamed, and
// AutoencoderKLQwenImage21's are Wan 2.2's with every causal conv folded to
// a 2-D conv of the single frame (FoldCausalConvsToImageConvs: the same
// row sharding, no time). Children are registered under the
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
//
// The encoder (WanEncoder3d) shards the same way, plus:
//  - the downsamplers' per-frame pad (0, 1, 0, 1) + 3x3 stride-2 conv is a
//    strided convolution (LayerOps::StridedConv: a band reads one row of the
//    band below); their (3,1,1) stride-2 time_conv is a strided convolution
//    too, row-local (one row tall: no halo, no collective);
//  - Wan 2.2's patchify and AvgDown3D shortcuts fold P (or 2) rows into one:
//    local, because bands are cut in whole latent rows at every level
//    (families/encoder.h RowLevelSpecs).

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
  // Bytes the cached frames hold.
  int64_t bytes() const;

 private:
  std::deque<Slot> slots_;
  size_t next_ = 0;
};

// A clip decoded so far: the feature cache carried from one latent frame to
// the next, and how many latent frames it has seen (the first is decoded
// alone into one frame).
struct WanDecodeState {
  FeatureCache cache;
  int64_t latent_frames = 0;
  int64_t bytes() const { return cache.bytes(); }
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

  // Qwen-Image-2.1's QwenImage21CausalConv3d: the same layer as a 2-D conv
  // of the single frame (its weight becomes [out, in, kh, kw], as its
  // checkpoints store it; the temporal taps are gone). A folded conv takes
  // one-frame inputs only, and never a cache.
  void FoldTime();
  bool folded() const { return weight.dim() == 4; }

 private:
  int64_t causal_pad_t_;  // frames of zeros in front without a cache
  int64_t pad_h_;
  int64_t pad_w_;
};
TORCH_MODULE(WanCausalConv3d);

// Folds every WanCausalConv3d under `root` (WanCausalConv3dImpl::FoldTime):
// the Wan blocks as Qwen-Image-2.1's image-only modules.
void FoldCausalConvsToImageConvs(torch::nn::Module& root);

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
  kNone,          // the last block: no upsampler
  kUpsample2d,    // nearest 2x in space per frame, 3x3 conv
  kUpsample3d,    // time_conv doubling the frames, then as kUpsample2d
  kDownsample2d,  // encoder: pad (0, 1, 0, 1), 3x3 stride-2 conv per frame
  kDownsample3d,  // encoder: as kDownsample2d, then a stride-2 time_conv halving the frames
};

// diffusers WanResample in its decoder modes, "upsample2d" (nearest 2x per
// frame, 3x3 conv) and "upsample3d" (first a causal (3,1,1) time_conv that
// doubles the frames — except on the first chunk, which stays one frame),
// and its encoder modes, "downsample2d" (pad (0, 1, 0, 1), 3x3 stride-2 conv
// per frame) and "downsample3d" (then a (3,1,1) stride-2 time_conv over the
// previous chunk's last frame and this chunk's — except on the first chunk,
// which stays one frame).
class WanResampleImpl : public torch::nn::Module {
 public:
  // `mode` is not kNone; `out_dim` is `dim` for the downsamplers.
  WanResampleImpl(int64_t dim, ResampleMode mode, int64_t out_dim);
  // Upsampling: [B, C, T, H, W] -> [B, C', T', 2H, 2W] (T' = 2T with a time_conv, past the first chunk).
  // Downsampling: [B, C, T, H, W] -> [B, C, T', H/2, W/2] (floored; T' = T/2 with a time_conv, past the first chunk).
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  // [0] WanUpsample or ZeroPad2d (parameter-free), [1] Conv2d 3x3
  torch::nn::ModuleList resample{nullptr};
  WanCausalConv3d time_conv{nullptr};  // upsample3d and downsample3d only

 private:
  at::Tensor UpsampleTime(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);
  at::Tensor DownsampleTime(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  ResampleMode mode_;
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

// diffusers AvgDown3D: the parameter-free shortcut of WanResidualDownBlock,
// DupUp3D's inverse: a (factor_t, factor_s, factor_s) space-to-depth whose
// channel groups are averaged down to out_channels. Time is front-padded
// with zeros to a multiple of factor_t (the first chunk's single frame).
class AvgDown3DImpl : public torch::nn::Module {
 public:
  AvgDown3DImpl(int64_t in_channels, int64_t out_channels, int64_t factor_t, int64_t factor_s);
  at::Tensor forward(const at::Tensor& x);  // [B, C, T, H, W] -> [B, C', ceil(T/ft), H/fs, W/fs]

 private:
  int64_t out_channels_;
  int64_t factor_t_;
  int64_t factor_s_;
  int64_t group_size_;
};
TORCH_MODULE(AvgDown3D);

// diffusers WanResidualDownBlock (Wan 2.2's encoder): num_res_blocks resnets
// and an optional downsampler, plus an AvgDown3D shortcut of its input.
class WanResidualDownBlockImpl : public torch::nn::Module {
 public:
  // `mode` is kNone (the last block), kDownsample2d or kDownsample3d.
  WanResidualDownBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks, ResampleMode mode);
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  AvgDown3D avg_shortcut{nullptr};
  torch::nn::ModuleList resnets{nullptr};
  WanResample downsampler{nullptr};  // absent for the last block
};
TORCH_MODULE(WanResidualDownBlock);

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

// diffusers WanEncoder3d (QwenImageEncoder3d), encoding one chunk: Wan 2.1's
// flat list of resnets and downsamplers, or Wan 2.2's WanResidualDownBlocks.
// Its output has 2·z_dim channels (mean and log-variance).
class WanEncoder3dImpl : public torch::nn::Module {
 public:
  explicit WanEncoder3dImpl(const WanConfig& config);
  // One chunk (1 frame first, then temporal_factor frames) of the
  // patchified input: [B, in_channels, t, H, W] -> [B, 2·z_dim, 1, H/2^(L-1), W/2^(L-1)].
  at::Tensor forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache);

  WanCausalConv3d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  WanMidBlock mid_block{nullptr};
  nn::ChannelRMSNorm norm_out{nullptr};
  WanCausalConv3d conv_out{nullptr};
};
TORCH_MODULE(WanEncoder3d);

// The encode side of diffusers' AutoencoderKLWan / AutoencoderKLQwenImage:
// the patchify, `encoder` with `_encode`'s chunk loop, and `quant_conv`.
class AutoencoderKLWanEncodeImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLWanEncodeImpl(const WanConfig& config);
  // x: [B, C, 1 + tf·k, H, W] -> moments [B, 2·z_dim, 1 + k, H/s, W/s].
  // A fresh feature cache per call: repeat encodes are independent.
  at::Tensor Encode(const at::Tensor& x, LayerOps& ops);

  WanEncoder3d encoder{nullptr};
  WanCausalConv3d quant_conv{nullptr};  // 1x1x1

 private:
  int64_t patch_size_;
  int64_t temporal_factor_;
};
TORCH_MODULE(AutoencoderKLWanEncode);

// The decode side of diffusers' AutoencoderKLWan / AutoencoderKLQwenImage:
// `post_quant_conv` and `decoder`, with `_decode`'s chunk loop.
class AutoencoderKLWanImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLWanImpl(const WanConfig& config);
  // The next latent frames of a clip whose earlier frames `state` has
  // seen: z: [B, z_dim, t, h, w] in VAE space -> their frames
  // [B, C, t·tf (1 + tf·(t-1) for the clip's first), h·s, w·s], clamped to
  // [-1, 1]. diffusers' _decode loop, one latent frame at a time
  // (post_quant_conv too, so that any split of a clip into chunks computes
  // exactly what the whole clip does); each frame's output goes to
  // ops.FramesFinished as it is final.
  at::Tensor DecodeFrames(const at::Tensor& z, LayerOps& ops, WanDecodeState& state);

  WanDecoder3d decoder{nullptr};
  WanCausalConv3d post_quant_conv{nullptr};  // 1x1x1

 private:
  int64_t patch_size_;
};
TORCH_MODULE(AutoencoderKLWan);

}  // namespace vaedecode::families::wan
