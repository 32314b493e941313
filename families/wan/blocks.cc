#include "families/wan/blocks.h"

#include "families/nn/modules.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/padding.h>

namespace vaedecode::families::wan {
namespace {

// diffusers' CACHE_T: frames a causal conv keeps from the previous chunk.
constexpr int64_t kCacheFrames = 2;

WanCausalConv3d MakeCausalConv(int64_t in, int64_t out, std::array<int64_t, 3> kernel, std::array<int64_t, 3> padding) {
  return WanCausalConv3d(std::make_shared<WanCausalConv3dImpl>(in, out, kernel, padding));
}

WanCausalConv3d MakeConv3x3x3(int64_t in, int64_t out) { return MakeCausalConv(in, out, {3, 3, 3}, {1, 1, 1}); }

// The last min(2, T) frames of x, completed to 2 frames with the slot's last
// frame when x has only one (diffusers' "cache last frame of last two chunk").
at::Tensor FramesToKeep(const at::Tensor& x, const FeatureCache::Slot& slot) {
  const int64_t t = x.size(2);
  const int64_t n = std::min(kCacheFrames, t);
  at::Tensor keep = x.narrow(2, t - n, n).clone();  // [B, C, n, H, W]
  if (n < kCacheFrames && slot.state == FeatureCache::Slot::State::kFrames) {
    const at::Tensor& old = slot.frames;
    keep = at::cat({old.narrow(2, old.size(2) - 1, 1), keep}, 2);
  }
  return keep;
}

bool IsDownsampling(ResampleMode mode) {
  return mode == ResampleMode::kDownsample2d || mode == ResampleMode::kDownsample3d;
}

}  // namespace

int64_t FeatureCache::bytes() const {
  int64_t total = 0;
  for (const Slot& slot : slots_) {
    if (slot.frames.defined()) total += static_cast<int64_t>(slot.frames.nbytes());
  }
  return total;
}

FeatureCache::Slot& FeatureCache::Next() {
  if (next_ == slots_.size()) slots_.emplace_back();
  return slots_[next_++];
}

WanCausalConv3dImpl::WanCausalConv3dImpl(int64_t in_channels, int64_t out_channels, std::array<int64_t, 3> kernel,
                                         std::array<int64_t, 3> padding)
    : torch::nn::Conv3dImpl(torch::nn::Conv3dOptions(in_channels, out_channels, {kernel[0], kernel[1], kernel[2]})),
      causal_pad_t_(2 * padding[0]),
      pad_h_(padding[1]),
      pad_w_(padding[2]) {}

void WanCausalConv3dImpl::FoldTime() {
  if (folded()) return;
  // Module::parameters_ holds the registered handle; both must be replaced.
  at::NoGradGuard no_grad;
  // The last temporal tap is the one a single frame meets (the others see
  // the causal zero padding). A copy, not a view: Module::to() rebases it.
  at::Tensor image_weight = weight.select(2, weight.size(2) - 1).clone();  // [O, I, kh, kw]
  image_weight.set_requires_grad(weight.requires_grad());
  parameters_["weight"] = image_weight;
  weight = image_weight;
  causal_pad_t_ = 0;
}

void FoldCausalConvsToImageConvs(torch::nn::Module& root) {
  for (const auto& module : root.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<WanCausalConv3dImpl>()) conv->FoldTime();
  }
}

at::Tensor WanCausalConv3dImpl::forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& cache) {
  if (folded()) {
    // diffusers squeezes the frame away, pads (H, W) and runs nn.Conv2d.
    TORCH_CHECK(x.size(2) == 1 && !cache.defined(), "an image conv (Qwen-Image-2.1) got ", x.size(2), " frames",
                cache.defined() ? " and a feature cache" : "");
    ConvGeometry g;
    g.padding_h = pad_h_;
    g.padding_w = pad_w_;
    return ops.Conv(x.squeeze(2), weight, bias, g).unsqueeze(2);  // [B, C', 1, H, W]
  }
  at::Tensor input = x;
  int64_t front = causal_pad_t_;
  if (cache.defined() && front > 0) {
    input = at::cat({cache.to(x.scalar_type()), x}, 2);  // [B, C, cached + T, H, W]
    front -= cache.size(2);
  }
  TORCH_CHECK(front >= 0, "a causal conv got ", cache.size(2), " cached frames for ", causal_pad_t_, " of padding");
  if (front > 0) input = at::constant_pad_nd(input, {0, 0, 0, 0, front, 0}, 0);
  // Time is fully padded now; H (sharded) and W pad as a "same" conv.
  ConvGeometry g;
  g.padding_h = pad_h_;
  g.padding_w = pad_w_;
  return ops.Conv(input, weight, bias, g);  // [B, C', T, H, W]
}

at::Tensor WanCausalConv3dImpl::ForwardCached(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  FeatureCache::Slot& slot = cache.Next();
  // An image conv has no later frame to keep anything for.
  if (folded()) return forward(x, ops);
  at::Tensor keep = FramesToKeep(x, slot);
  const bool cached = slot.state == FeatureCache::Slot::State::kFrames;
  at::Tensor out = forward(x, ops, cached ? slot.frames : at::Tensor());
  slot.state = FeatureCache::Slot::State::kFrames;
  slot.frames = std::move(keep);
  return out;
}

WanResidualBlockImpl::WanResidualBlockImpl(int64_t in_dim, int64_t out_dim) {
  norm1 = register_module("norm1", nn::ChannelRMSNorm(in_dim, /*images=*/false));
  conv1 = register_module("conv1", MakeConv3x3x3(in_dim, out_dim));
  norm2 = register_module("norm2", nn::ChannelRMSNorm(out_dim, /*images=*/false));
  conv2 = register_module("conv2", MakeConv3x3x3(out_dim, out_dim));
  if (in_dim != out_dim) {
    conv_shortcut = register_module("conv_shortcut", MakeCausalConv(in_dim, out_dim, {1, 1, 1}, {0, 0, 0}));
  }
}

at::Tensor WanResidualBlockImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  const at::Tensor shortcut = conv_shortcut ? conv_shortcut->forward(x, ops) : x;  // no cache: 1x1x1
  at::Tensor h = at::silu(norm1->forward(x));
  h = conv1->ForwardCached(h, ops, cache);
  h = at::silu(norm2->forward(h));
  h = conv2->ForwardCached(h, ops, cache);
  return h + shortcut;
}

WanAttentionBlockImpl::WanAttentionBlockImpl(int64_t dim) {
  norm = register_module("norm", nn::ChannelRMSNorm(dim, /*images=*/true));
  to_qkv = register_module("to_qkv", nn::MakeConv2d(dim, dim * 3, 1));
  proj = register_module("proj", nn::MakeConv2d(dim, dim, 1));
}

at::Tensor WanAttentionBlockImpl::forward(const at::Tensor& x, LayerOps& ops) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor frames = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});  // [B·T, C, H, W]
  frames = norm->forward(frames);
  at::Tensor qkv = nn::RunConv2d(ops, *to_qkv, frames);                            // [B·T, 3C, H, W]
  qkv = qkv.reshape({b * t, 1, 3 * c, h * w}).permute({0, 1, 3, 2}).contiguous();  // [B·T, 1, H·W, 3C]
  const std::vector<at::Tensor> q_k_v = qkv.chunk(3, -1);                          // 3 x [B·T, 1, H·W, C]
  // Tokens are a frame's pixels in row-major order: a row band is a contiguous run.
  // [B·T, 1, H·W, C]: per-frame attention, frames folded into the batch.
  at::Tensor out = ops.Attention(q_k_v[0], q_k_v[1], q_k_v[2], TokenLayout::Full(/*tokens_per_row=*/w));
  out = out.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, w});
  out = nn::RunConv2d(ops, *proj, out);                      // [B·T, C, H, W]
  out = out.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4});  // [B, C, T, H, W]
  return out + x;
}

WanMidBlockImpl::WanMidBlockImpl(int64_t dim) {
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets = register_module("resnets", torch::nn::ModuleList());
  resnets->push_back(WanResidualBlock(dim, dim));
  attentions->push_back(WanAttentionBlock(dim));
  resnets->push_back(WanResidualBlock(dim, dim));
}

at::Tensor WanMidBlockImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  at::Tensor h = resnets[0]->as<WanResidualBlockImpl>()->forward(x, ops, cache);
  h = attentions[0]->as<WanAttentionBlockImpl>()->forward(h, ops);
  return resnets[1]->as<WanResidualBlockImpl>()->forward(h, ops, cache);
}

at::Tensor WanUpsampleImpl::forward(const at::Tensor& x) {
  // diffusers' WanUpsample goes through float32; a nearest copy is the same without it.
  return nn::UpsampleNearest(x, 1, 2);
}

WanResampleImpl::WanResampleImpl(int64_t dim, ResampleMode mode, int64_t out_dim) : mode_(mode) {
  TORCH_CHECK(mode != ResampleMode::kNone, "WanResample needs a resample mode");
  resample = register_module("resample", torch::nn::ModuleList());
  if (IsDownsampling(mode)) {
    // The pad happens in ops.StridedConv; [0] keeps diffusers' indices.
    resample->push_back(torch::nn::ZeroPad2d(torch::nn::ZeroPad2dOptions({0, 1, 0, 1})));
    resample->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 3).stride(2)));
  } else {
    resample->push_back(WanUpsample());
    resample->push_back(nn::MakeConv2d(dim, out_dim, 3));
  }
  if (mode == ResampleMode::kUpsample3d) {
    time_conv = register_module("time_conv", MakeCausalConv(dim, dim * 2, {3, 1, 1}, {1, 0, 0}));
  }
  if (mode == ResampleMode::kDownsample3d) {
    // Stride 2 in time (DownsampleTime runs it as a strided conv).
    time_conv = register_module("time_conv", MakeCausalConv(dim, dim, {3, 1, 1}, {0, 0, 0}));
  }
}

at::Tensor WanResampleImpl::UpsampleTime(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  using State = FeatureCache::Slot::State;
  FeatureCache::Slot& slot = cache.Next();
  if (slot.state == State::kEmpty) {
    // The first chunk stays one frame; later chunks double.
    slot.state = State::kRepeat;
    return x;
  }
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor keep = FramesToKeep(x, slot);
  if (keep.size(2) < kCacheFrames) keep = at::cat({at::zeros_like(keep), keep}, 2);  // after "Rep"
  at::Tensor y = time_conv->forward(x, ops, slot.state == State::kFrames ? slot.frames : at::Tensor());
  slot.state = State::kFrames;
  slot.frames = std::move(keep);
  // [B, 2C, T, H, W]: channel j·C + c is frame 2t + j of channel c.
  y = y.reshape({b, 2, c, t, h, w});
  y = at::stack({y.select(1, 0), y.select(1, 1)}, 3);  // [B, C, T, 2, H, W]
  return y.reshape({b, c, t * 2, h, w});
}

at::Tensor WanResampleImpl::DownsampleTime(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  FeatureCache::Slot& slot = cache.Next();
  if (slot.state == FeatureCache::Slot::State::kEmpty) {
    // The first chunk stays one frame; it is kept for the next chunk (an
    // image-only encoder has none).
    slot.state = FeatureCache::Slot::State::kFrames;
    if (!time_conv->folded()) slot.frames = x.clone();
    return x;
  }
  const int64_t t = x.size(2);
  at::Tensor keep = x.narrow(2, t - 1, 1).clone();
  const at::Tensor& old = slot.frames;
  const at::Tensor input = at::cat({old.narrow(2, old.size(2) - 1, 1), x}, 2);  // [B, C, 1 + T, H, W]
  // (3,1,1) with stride 2 in time, no padding: row-local (no halo).
  StridedConvGeometry g;
  g.stride = 1;
  g.stride_t = 2;
  at::Tensor y = ops.StridedConv(input, time_conv->weight, time_conv->bias, g);  // [B, C, T / 2, H, W]
  slot.frames = std::move(keep);
  return y;
}

at::Tensor WanResampleImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  const bool down = IsDownsampling(mode_);
  const at::Tensor in = (time_conv && !down) ? UpsampleTime(x, ops, cache) : x;  // [B, C, T', H, W]
  const int64_t b = in.size(0), c = in.size(1), t = in.size(2);
  at::Tensor frames = in.permute({0, 2, 1, 3, 4}).reshape({b * t, c, in.size(3), in.size(4)});  // [B·T', C, H, W]
  const auto& conv = *resample[1]->as<torch::nn::Conv2dImpl>();
  if (down) {
    StridedConvGeometry g;  // nn.ZeroPad2d((0, 1, 0, 1)), then the 3x3 stride-2 conv
    g.stride = 2;
    g.pad_bottom = 1;
    g.pad_right = 1;
    frames = ops.StridedConv(frames, conv.weight, conv.bias, g);  // [B·T', C, H/2, W/2]
  } else {
    frames = resample[0]->as<WanUpsampleImpl>()->forward(frames);  // [B·T', C, 2H, 2W]
    frames = nn::RunConv2d(ops, conv, frames);                     // [B·T', C', 2H, 2W]
  }
  at::Tensor out = frames.view({b, t, frames.size(1), frames.size(2), frames.size(3)}).permute({0, 2, 1, 3, 4});
  return mode_ == ResampleMode::kDownsample3d ? DownsampleTime(out, ops, cache) : out;
}

DupUp3DImpl::DupUp3DImpl(int64_t in_channels, int64_t out_channels, int64_t factor_t, int64_t factor_s)
    : out_channels_(out_channels), factor_t_(factor_t), factor_s_(factor_s) {
  const int64_t factor = factor_t * factor_s * factor_s;
  TORCH_CHECK(out_channels * factor % in_channels == 0, "DupUp3D: ", out_channels, "·", factor,
              " is not a multiple of ", in_channels);
  repeats_ = out_channels * factor / in_channels;
}

at::Tensor DupUp3DImpl::forward(const at::Tensor& x, bool first_chunk) {
  const int64_t b = x.size(0), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor y = x.repeat_interleave(repeats_, 1);  // [B, C·r, T, H, W]
  y = y.reshape({b, out_channels_, factor_t_, factor_s_, factor_s_, t, h, w});
  y = y.permute({0, 1, 5, 2, 6, 3, 7, 4}).contiguous();  // [B, C', T, ft, H, fs, W, fs]
  y = y.view({b, out_channels_, t * factor_t_, h * factor_s_, w * factor_s_});
  // The first chunk's upsamplers did not double time: keep its last frame.
  if (first_chunk) y = y.narrow(2, factor_t_ - 1, y.size(2) - (factor_t_ - 1));
  return y;
}

AvgDown3DImpl::AvgDown3DImpl(int64_t in_channels, int64_t out_channels, int64_t factor_t, int64_t factor_s)
    : out_channels_(out_channels), factor_t_(factor_t), factor_s_(factor_s) {
  const int64_t factor = factor_t * factor_s * factor_s;
  TORCH_CHECK(in_channels * factor % out_channels == 0, "AvgDown3D: ", in_channels, "·", factor,
              " is not a multiple of ", out_channels);
  group_size_ = in_channels * factor / out_channels;
}

at::Tensor AvgDown3DImpl::forward(const at::Tensor& x) {
  const int64_t pad_t = (factor_t_ - x.size(2) % factor_t_) % factor_t_;
  const at::Tensor padded = pad_t > 0 ? at::constant_pad_nd(x, {0, 0, 0, 0, pad_t, 0}, 0) : x;
  const int64_t b = padded.size(0), c = padded.size(1);
  const int64_t t = padded.size(2) / factor_t_, h = padded.size(3) / factor_s_, w = padded.size(4) / factor_s_;
  TORCH_CHECK(h * factor_s_ == padded.size(3) && w * factor_s_ == padded.size(4), "AvgDown3D by ", factor_s_, " of ",
              padded.size(3), "x", padded.size(4));
  at::Tensor y = padded.reshape({b, c, t, factor_t_, h, factor_s_, w, factor_s_});
  y = y.permute({0, 1, 3, 5, 7, 2, 4, 6}).contiguous();  // [B, C, ft, fs, fs, T, H, W]
  y = y.view({b, out_channels_, group_size_, t, h, w});
  return y.mean(2);
}

WanResidualDownBlockImpl::WanResidualDownBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks,
                                                   ResampleMode mode) {
  const int64_t factor_t = mode == ResampleMode::kDownsample3d ? 2 : 1;
  const int64_t factor_s = mode == ResampleMode::kNone ? 1 : 2;
  avg_shortcut = register_module("avg_shortcut", AvgDown3D(in_dim, out_dim, factor_t, factor_s));
  resnets = register_module("resnets", torch::nn::ModuleList());
  int64_t dim = in_dim;
  for (int64_t i = 0; i < num_res_blocks; ++i) {
    resnets->push_back(WanResidualBlock(dim, out_dim));
    dim = out_dim;
  }
  if (mode != ResampleMode::kNone) downsampler = register_module("downsampler", WanResample(out_dim, mode, out_dim));
}

at::Tensor WanResidualDownBlockImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<WanResidualBlockImpl>()->forward(h, ops, cache);
  if (downsampler) h = downsampler->forward(h, ops, cache);
  return h + avg_shortcut->forward(x);
}

WanUpBlockImpl::WanUpBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks, ResampleMode mode) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  upsamplers = register_module("upsamplers", torch::nn::ModuleList());
  int64_t dim = in_dim;
  for (int64_t i = 0; i <= num_res_blocks; ++i) {
    resnets->push_back(WanResidualBlock(dim, out_dim));
    dim = out_dim;
  }
  // Wan 2.1's upsamplers halve the width (upsample_out_dim = dim // 2).
  if (mode != ResampleMode::kNone) upsamplers->push_back(WanResample(out_dim, mode, out_dim / 2));
}

at::Tensor WanUpBlockImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<WanResidualBlockImpl>()->forward(h, ops, cache);
  for (const auto& up : *upsamplers) h = up->as<WanResampleImpl>()->forward(h, ops, cache);
  return h;
}

WanResidualUpBlockImpl::WanResidualUpBlockImpl(int64_t in_dim, int64_t out_dim, int64_t num_res_blocks,
                                               ResampleMode mode) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  int64_t dim = in_dim;
  for (int64_t i = 0; i <= num_res_blocks; ++i) {
    resnets->push_back(WanResidualBlock(dim, out_dim));
    dim = out_dim;
  }
  if (mode != ResampleMode::kNone) {
    upsampler = register_module("upsampler", WanResample(out_dim, mode, out_dim));
    const int64_t factor_t = mode == ResampleMode::kUpsample3d ? 2 : 1;
    avg_shortcut = register_module("avg_shortcut", DupUp3D(in_dim, out_dim, factor_t, 2));
  }
}

at::Tensor WanResidualUpBlockImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache, bool first_chunk) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) h = resnet->as<WanResidualBlockImpl>()->forward(h, ops, cache);
  if (upsampler) h = upsampler->forward(h, ops, cache);
  if (avg_shortcut) h = h + avg_shortcut->forward(x, first_chunk);
  return h;
}

WanDecoder3dImpl::WanDecoder3dImpl(const WanConfig& c) {
  const std::vector<int64_t> dims = c.decoder_dims();  // [mid, block 0 out, ..., block L-1 out]
  const int64_t levels = c.levels();
  const bool residual = c.up_block_type() == UpBlockType::kResidualUpBlock;
  conv_in = register_module("conv_in", MakeConv3x3x3(c.z_dim, dims[0]));
  mid_block = register_module("mid_block", WanMidBlock(dims[0]));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < levels; ++i) {
    // Wan 2.1's upsamplers halve the width; the next block widens it again.
    const int64_t in_dim = (i > 0 && !residual) ? dims[i] / 2 : dims[i];
    const ResampleMode mode = i == levels - 1                ? ResampleMode::kNone
                              : c.up_block_upsamples_time(i) ? ResampleMode::kUpsample3d
                                                             : ResampleMode::kUpsample2d;
    if (residual) {
      up_blocks->push_back(WanResidualUpBlock(in_dim, dims[i + 1], c.num_res_blocks, mode));
    } else {
      up_blocks->push_back(WanUpBlock(in_dim, dims[i + 1], c.num_res_blocks, mode));
    }
  }
  norm_out = register_module("norm_out", nn::ChannelRMSNorm(dims.back(), /*images=*/false));
  conv_out = register_module("conv_out", MakeConv3x3x3(dims.back(), c.out_channels));
}

at::Tensor WanDecoder3dImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache, bool first_chunk) {
  at::Tensor h = conv_in->ForwardCached(x, ops, cache);  // [B, C, 1, h, w]
  h = mid_block->forward(h, ops, cache);
  for (const auto& block : *up_blocks) {
    if (auto* up = block->as<WanUpBlockImpl>()) {
      h = up->forward(h, ops, cache);
    } else {
      h = block->as<WanResidualUpBlockImpl>()->forward(h, ops, cache, first_chunk);
    }
  }
  h = at::silu(norm_out->forward(h));
  return conv_out->ForwardCached(h, ops, cache);  // [B, out_channels, T', H, W]
}

WanEncoder3dImpl::WanEncoder3dImpl(const WanConfig& c) {
  const std::vector<int64_t> dims = c.encoder_dims();  // [conv_in out, level 0 out, ..., level L-1 out]
  const int64_t levels = c.levels();
  conv_in = register_module("conv_in", MakeConv3x3x3(c.in_channels, dims[0]));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < levels; ++i) {
    const ResampleMode mode = i == levels - 1                    ? ResampleMode::kNone
                              : c.down_level_downsamples_time(i) ? ResampleMode::kDownsample3d
                                                                 : ResampleMode::kDownsample2d;
    if (c.is_residual) {
      down_blocks->push_back(WanResidualDownBlock(dims[i], dims[i + 1], c.num_res_blocks, mode));
      continue;
    }
    // Wan 2.1: a flat list (attention blocks at attn_scales are refused by the encoder's loader).
    int64_t dim = dims[i];
    for (int64_t j = 0; j < c.num_res_blocks; ++j) {
      down_blocks->push_back(WanResidualBlock(dim, dims[i + 1]));
      dim = dims[i + 1];
    }
    if (mode != ResampleMode::kNone) down_blocks->push_back(WanResample(dims[i + 1], mode, dims[i + 1]));
  }
  mid_block = register_module("mid_block", WanMidBlock(dims.back()));
  norm_out = register_module("norm_out", nn::ChannelRMSNorm(dims.back(), /*images=*/false));
  conv_out = register_module("conv_out", MakeConv3x3x3(dims.back(), 2 * c.z_dim));
}

at::Tensor WanEncoder3dImpl::forward(const at::Tensor& x, LayerOps& ops, FeatureCache& cache) {
  at::Tensor h = conv_in->ForwardCached(x, ops, cache);
  for (const auto& block : *down_blocks) {
    if (auto* resnet = block->as<WanResidualBlockImpl>()) {
      h = resnet->forward(h, ops, cache);
    } else if (auto* resample = block->as<WanResampleImpl>()) {
      h = resample->forward(h, ops, cache);
    } else {
      h = block->as<WanResidualDownBlockImpl>()->forward(h, ops, cache);
    }
  }
  h = mid_block->forward(h, ops, cache);
  h = at::silu(norm_out->forward(h));
  return conv_out->ForwardCached(h, ops, cache);  // [B, 2·z_dim, 1, h, w]
}

AutoencoderKLWanEncodeImpl::AutoencoderKLWanEncodeImpl(const WanConfig& c)
    : patch_size_(c.patch()), temporal_factor_(c.temporal_factor()) {
  encoder = register_module("encoder", WanEncoder3d(c));
  quant_conv = register_module("quant_conv", MakeCausalConv(2 * c.z_dim, 2 * c.z_dim, {1, 1, 1}, {0, 0, 0}));
  if (c.image_convs) FoldCausalConvsToImageConvs(*this);
}

at::Tensor AutoencoderKLWanEncodeImpl::Encode(const at::Tensor& x, LayerOps& ops) {
  const at::Tensor patches = nn::Patchify(x, patch_size_);  // [B, C·P·P, T, H/P, W/P]
  const int64_t frames = patches.size(2);
  TORCH_CHECK((frames - 1) % temporal_factor_ == 0, "an encode of ", frames, " frames (needs 1 + ", temporal_factor_,
              "·k)");
  FeatureCache cache;
  std::vector<at::Tensor> chunks;
  // diffusers' _encode: the first frame alone, then temporal_factor frames at a time.
  for (int64_t begin = 0; begin < frames;) {
    const int64_t length = begin == 0 ? 1 : temporal_factor_;
    cache.BeginChunk();
    chunks.push_back(encoder->forward(patches.narrow(2, begin, length), ops, cache));
    TORCH_CHECK(cache.used() == cache.size(), "chunk ", chunks.size() - 1, " visited ", cache.used(), " of ",
                cache.size(), " cached layers");
    begin += length;
  }
  const at::Tensor out = chunks.size() == 1 ? chunks[0] : at::cat(chunks, 2);
  return quant_conv->forward(out, ops);  // [B, 2·z_dim, 1 + k, h, w]
}

AutoencoderKLWanImpl::AutoencoderKLWanImpl(const WanConfig& c) : patch_size_(c.patch()) {
  decoder = register_module("decoder", WanDecoder3d(c));
  post_quant_conv = register_module("post_quant_conv", MakeCausalConv(c.z_dim, c.z_dim, {1, 1, 1}, {0, 0, 0}));
  if (c.image_convs) FoldCausalConvsToImageConvs(*this);
}

at::Tensor AutoencoderKLWanImpl::DecodeFrames(const at::Tensor& z, LayerOps& ops, WanDecodeState& state) {
  std::vector<at::Tensor> chunks;
  for (int64_t i = 0; i < z.size(2); ++i) {
    const at::Tensor x = post_quant_conv->forward(z.narrow(2, i, 1), ops);  // [B, z, 1, h, w]
    FeatureCache& cache = state.cache;
    cache.BeginChunk();
    const at::Tensor chunk = decoder->forward(x, ops, cache, /*first_chunk=*/state.latent_frames == 0);
    TORCH_CHECK(cache.used() == cache.size(), "latent frame ", state.latent_frames, " visited ", cache.used(), " of ",
                cache.size(), " cached layers");
    ++state.latent_frames;
    // Unpatchify and clamp act frame by frame, so each chunk's frames are
    // final here: the caller may stream them before the next chunk decodes.
    chunks.push_back(at::clamp(nn::Unpatchify(chunk, patch_size_), -1.0, 1.0));  // [B, C, t, H, W]
    ops.FramesFinished(chunks.back());
  }
  return chunks.size() == 1 ? chunks[0] : at::cat(chunks, 2);
}

}  // namespace vaedecode::families::wan
