#include "families/ltx2/blocks.h"

#include <cmath>

#include <ATen/ATen.h>

#include "families/nn/modules.h"

namespace vaedecode::families::ltx2 {
namespace {

constexpr int64_t kTimestepProjectionChannels = 256;  // PixArt's Timesteps(num_channels=256)

torch::nn::Conv3d MakeConv3d(int64_t in, int64_t out, int64_t kernel) {
  return torch::nn::Conv3d(torch::nn::Conv3dOptions(in, out, kernel));
}

// diffusers' depth-to-space of the upsampler: channel c·st·sh·sw + i·sh·sw + j·sw + k
// of frame f, row y, column x goes to (c, f·st + i, y·sh + j, x·sw + k).
at::Tensor DepthToSpace(const at::Tensor& x, const std::vector<int64_t>& s) {
  const int64_t b = x.size(0), f = x.size(2), h = x.size(3), w = x.size(4);
  return x.reshape({b, -1, s[0], s[1], s[2], f, h, w})
      .permute({0, 1, 5, 2, 6, 3, 7, 4})  // [B, C, F, st, H, sh, W, sw]
      .reshape({b, -1, f * s[0], h * s[1], w * s[2]});
}

// The inverse: the downsamplers' space-to-depth, (c, f·st + i, y·sh + j,
// x·sw + k) to channel c·st·sh·sw + i·sh·sw + j·sw + k of (f, y, x).
at::Tensor SpaceToDepth(const at::Tensor& x, const std::vector<int64_t>& s) {
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2) / s[0], h = x.size(3) / s[1], w = x.size(4) / s[2];
  return x.reshape({b, c, f, s[0], h, s[1], w, s[2]})
      .permute({0, 1, 3, 5, 7, 2, 4, 6})  // [B, C, st, sh, sw, F, H, W]
      .reshape({b, c * s[0] * s[1] * s[2], f, h, w});
}

// x · (1 + scale) + shift with per-channel [B, C, 1, 1, 1] modulation.
at::Tensor Modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale) + shift;
}

}  // namespace

at::Tensor PerChannelRMSNorm(const at::Tensor& x, double eps) {
  const at::Tensor mean_sq = at::mean(x.pow(2), {1}, /*keepdim=*/true);
  return x / at::sqrt(mean_sq + eps);
}

LTX2VideoCausalConv3dImpl::LTX2VideoCausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel,
                                                     PaddingMode mode, int64_t stride)
    : mode_(mode), stride_(stride) {
  conv = register_module("conv", MakeConv3d(in_channels, out_channels, kernel));
}

at::Tensor LTX2VideoCausalConv3dImpl::forward(const at::Tensor& x, LayerOps& ops, bool causal,
                                              nn::CausalFrames* stream) {
  const int64_t kt = conv->weight.size(2);
  at::Tensor padded;  // [B, C, T + kt - 1, H, W]
  if (causal && stream != nullptr) {
    padded = stream->Extend(this, x, kt - 1);  // the frames before the chunk (the clip's first, repeated, at its start)
  } else if (causal) {
    padded = at::cat({x.narrow(2, 0, 1).repeat({1, 1, kt - 1, 1, 1}), x}, 2);
  } else {
    const int64_t side = (kt - 1) / 2;
    padded = at::cat(
        {x.narrow(2, 0, 1).repeat({1, 1, side, 1, 1}), x, x.narrow(2, x.size(2) - 1, 1).repeat({1, 1, side, 1, 1})}, 2);
  }
  if (stride_ > 1) {
    StridedConvGeometry g;
    g.stride = stride_;
    g.stride_t = stride_;
    g.pad_top = g.pad_bottom = conv->weight.size(3) / 2;
    g.pad_left = g.pad_right = conv->weight.size(4) / 2;
    g.mode = mode_;
    return ops.StridedConv(padded, conv->weight, conv->bias, g);
  }
  ConvGeometry g;
  g.padding_h = conv->weight.size(3) / 2;
  g.padding_w = conv->weight.size(4) / 2;
  g.mode = mode_;
  return ops.Conv(padded, conv->weight, conv->bias, g);
}

TimestepEmbeddingImpl::TimestepEmbeddingImpl(int64_t in_channels, int64_t embedding_dim) {
  linear_1 = register_module("linear_1", torch::nn::Linear(in_channels, embedding_dim));
  linear_2 = register_module("linear_2", torch::nn::Linear(embedding_dim, embedding_dim));
}

at::Tensor TimestepEmbeddingImpl::forward(const at::Tensor& x) {
  return linear_2->forward(at::silu(linear_1->forward(x)));
}

at::Tensor SinusoidalTimestepEmbedding(const at::Tensor& timestep, int64_t dim) {
  const int64_t half = dim / 2;
  at::Tensor exponent =
      at::arange(0, half, at::TensorOptions().dtype(at::kFloat).device(timestep.device())) * (-std::log(10000.0));
  exponent = exponent / static_cast<double>(half);                                         // downscale_freq_shift 0
  at::Tensor emb = timestep.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);  // [B, half]
  emb = at::cat({at::cos(emb), at::sin(emb)}, -1);                                         // flip_sin_to_cos
  if (dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1}, 0);
  return emb;
}

TimestepEmbedderImpl::TimestepEmbedderImpl(int64_t embedding_dim) {
  timestep_embedder =
      register_module("timestep_embedder", TimestepEmbedding(kTimestepProjectionChannels, embedding_dim));
}

at::Tensor TimestepEmbedderImpl::forward(const at::Tensor& timestep, at::ScalarType dtype) {
  return timestep_embedder->forward(SinusoidalTimestepEmbedding(timestep, kTimestepProjectionChannels).to(dtype));
}

LTX2VideoResnetBlock3dImpl::LTX2VideoResnetBlock3dImpl(int64_t in_channels, int64_t out_channels, double eps,
                                                       bool timestep_conditioning, PaddingMode mode) {
  conv1 = register_module("conv1", LTX2VideoCausalConv3d(in_channels, out_channels, 3, mode));
  conv2 = register_module("conv2", LTX2VideoCausalConv3d(out_channels, out_channels, 3, mode));
  if (in_channels != out_channels) {
    norm3 = register_module(
        "norm3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({in_channels}).eps(eps).elementwise_affine(true)));
    conv_shortcut = register_module("conv_shortcut", MakeConv3d(in_channels, out_channels, 1));
  }
  if (timestep_conditioning) {
    scale_shift_table = register_parameter("scale_shift_table", at::zeros({4, in_channels}));
  }
}

at::Tensor LTX2VideoResnetBlock3dImpl::forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& temb, bool causal,
                                               nn::CausalFrames* stream) {
  at::Tensor shift_1, scale_1, shift_2, scale_2;  // [B, C, 1, 1, 1]
  if (scale_shift_table.defined()) {
    const int64_t b = x.size(0), c = scale_shift_table.size(1);
    const at::Tensor t = temb.view({b, 4, c, 1, 1, 1}) + scale_shift_table.view({1, 4, c, 1, 1, 1});
    shift_1 = t.select(1, 0);
    scale_1 = t.select(1, 1);
    shift_2 = t.select(1, 2);
    scale_2 = t.select(1, 3);
  }
  at::Tensor h = PerChannelRMSNorm(x);
  if (shift_1.defined()) h = Modulate(h, shift_1, scale_1);
  h = conv1->forward(at::silu(h), ops, causal, stream);
  h = PerChannelRMSNorm(h);
  if (shift_2.defined()) h = Modulate(h, shift_2, scale_2);
  h = conv2->forward(at::silu(h), ops, causal, stream);

  at::Tensor shortcut = x;
  if (norm3) shortcut = norm3->forward(shortcut.movedim(1, -1)).movedim(-1, 1);
  if (conv_shortcut) shortcut = ops.Conv(shortcut, conv_shortcut->weight, conv_shortcut->bias, ConvGeometry{});
  return h + shortcut;
}

LTX2VideoUpsampler3dImpl::LTX2VideoUpsampler3dImpl(int64_t in_channels, std::vector<int64_t> stride, bool residual,
                                                   int64_t upscale_factor, PaddingMode mode)
    : stride_(std::move(stride)), residual_(residual), upscale_factor_(upscale_factor) {
  const int64_t cells = stride_[0] * stride_[1] * stride_[2];
  conv = register_module("conv", LTX2VideoCausalConv3d(in_channels, in_channels * cells / upscale_factor, 3, mode));
}

at::Tensor LTX2VideoUpsampler3dImpl::forward(const at::Tensor& x, LayerOps& ops, bool causal,
                                             nn::CausalFrames* stream) {
  // The first input frame's first stride_t - 1 output frames are dropped:
  // the clip's, so not a later chunk's.
  const int64_t dropped = stream == nullptr || stream->AtClipStart(this) ? stride_[0] - 1 : 0;
  at::Tensor h = DepthToSpace(conv->forward(x, ops, causal, stream), stride_);
  h = h.narrow(2, dropped, h.size(2) - dropped);
  if (!residual_) return h;
  const int64_t repeats = stride_[0] * stride_[1] * stride_[2] / upscale_factor_;
  at::Tensor residual = DepthToSpace(x, stride_).repeat({1, repeats, 1, 1, 1});
  residual = residual.narrow(2, dropped, residual.size(2) - dropped);
  return h + residual;
}

LTX2VideoMidBlock3dImpl::LTX2VideoMidBlock3dImpl(int64_t channels, int64_t num_layers, double eps,
                                                 bool timestep_conditioning, PaddingMode mode) {
  if (timestep_conditioning) time_embedder = register_module("time_embedder", TimestepEmbedder(channels * 4));
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < num_layers; ++i) {
    resnets->push_back(LTX2VideoResnetBlock3d(channels, channels, eps, timestep_conditioning, mode));
  }
}

at::Tensor LTX2VideoMidBlock3dImpl::forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& timestep, bool causal,
                                            nn::CausalFrames* stream) {
  at::Tensor temb;
  if (time_embedder) temb = time_embedder->forward(timestep.flatten(), x.scalar_type()).view({x.size(0), -1, 1, 1, 1});
  at::Tensor h = x;
  for (const auto& resnet : *resnets) {
    h = resnet->as<LTX2VideoResnetBlock3dImpl>()->forward(h, ops, temb, causal, stream);
  }
  return h;
}

LTX2VideoUpBlock3dImpl::LTX2VideoUpBlock3dImpl(const UpBlockSpec& spec, double eps, bool timestep_conditioning,
                                               PaddingMode mode) {
  if (timestep_conditioning) {
    time_embedder = register_module("time_embedder", TimestepEmbedder(spec.in_channels * 4));
  }
  if (spec.in_channels != spec.out_channels) {
    // Config validation refuses this with timestep conditioning.
    conv_in = register_module("conv_in", LTX2VideoResnetBlock3d(spec.in_channels, spec.out_channels, eps,
                                                                /*timestep_conditioning=*/false, mode));
  }
  if (spec.upsample) {
    upsamplers = register_module("upsamplers", torch::nn::ModuleList());
    upsamplers->push_back(LTX2VideoUpsampler3d(spec.out_channels * spec.upscale_factor, spec.stride,
                                               spec.upsample_residual, spec.upscale_factor, mode));
  }
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(LTX2VideoResnetBlock3d(spec.out_channels, spec.out_channels, eps, timestep_conditioning, mode));
  }
}

at::Tensor LTX2VideoUpBlock3dImpl::forward(const at::Tensor& x, LayerOps& ops, const at::Tensor& timestep, bool causal,
                                           nn::CausalFrames* stream) {
  at::Tensor h = x;
  if (conv_in) h = conv_in->forward(h, ops, at::Tensor(), causal, stream);
  at::Tensor temb;
  if (time_embedder) temb = time_embedder->forward(timestep.flatten(), h.scalar_type()).view({h.size(0), -1, 1, 1, 1});
  if (upsamplers) {
    for (const auto& up : *upsamplers) h = up->as<LTX2VideoUpsampler3dImpl>()->forward(h, ops, causal, stream);
  }
  for (const auto& resnet : *resnets) {
    h = resnet->as<LTX2VideoResnetBlock3dImpl>()->forward(h, ops, temb, causal, stream);
  }
  return h;
}

LTX2VideoDownsampler3dImpl::LTX2VideoDownsampler3dImpl(int64_t in_channels, int64_t out_channels,
                                                       std::vector<int64_t> stride, PaddingMode mode)
    : stride_(std::move(stride)) {
  const int64_t cells = stride_[0] * stride_[1] * stride_[2];
  group_size_ = in_channels * cells / out_channels;
  conv = register_module("conv", LTX2VideoCausalConv3d(in_channels, out_channels / cells, 3, mode));
}

at::Tensor LTX2VideoDownsampler3dImpl::forward(const at::Tensor& x, LayerOps& ops, bool causal) {
  const at::Tensor h = stride_[0] > 1 ? at::cat({x.narrow(2, 0, stride_[0] - 1), x}, 2) : x;
  at::Tensor residual = SpaceToDepth(h, stride_);
  residual = residual.unflatten(1, {-1, group_size_}).mean(2);
  return SpaceToDepth(conv->forward(h, ops, causal), stride_) + residual;
}

LTX2VideoDownBlock3DImpl::LTX2VideoDownBlock3DImpl(const DownBlockSpec& spec, double eps, PaddingMode mode) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t i = 0; i < spec.num_layers; ++i) {
    resnets->push_back(
        LTX2VideoResnetBlock3d(spec.in_channels, spec.in_channels, eps, /*timestep_conditioning=*/false, mode));
  }
  if (spec.downsample_type.empty()) return;
  downsamplers = register_module("downsamplers", torch::nn::ModuleList());
  if (spec.downsample_type == "conv") {
    downsamplers->push_back(LTX2VideoCausalConv3d(spec.in_channels, spec.in_channels, 3, mode, /*stride=*/2));
  } else {
    downsamplers->push_back(LTX2VideoDownsampler3d(spec.in_channels, spec.out_channels, spec.stride, mode));
  }
}

at::Tensor LTX2VideoDownBlock3DImpl::forward(const at::Tensor& x, LayerOps& ops, bool causal) {
  at::Tensor h = x;
  for (const auto& resnet : *resnets) {
    h = resnet->as<LTX2VideoResnetBlock3dImpl>()->forward(h, ops, at::Tensor(), causal);
  }
  if (!downsamplers) return h;
  for (const auto& down : *downsamplers) {
    if (auto* folding = down->as<LTX2VideoDownsampler3dImpl>()) {
      h = folding->forward(h, ops, causal);
    } else {
      h = down->as<LTX2VideoCausalConv3dImpl>()->forward(h, ops, causal);
    }
  }
  return h;
}

LTX2VideoEncoder3dImpl::LTX2VideoEncoder3dImpl(const LTX2Config& c)
    : causal_(c.encoder_causal), patch_size_(c.patch_size) {
  const PaddingMode mode = c.encoder_spatial_padding;
  conv_in = register_module(
      "conv_in", LTX2VideoCausalConv3d(c.in_channels * c.patch_size * c.patch_size, c.latent_channels, 3, mode));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (const DownBlockSpec& spec : c.DownBlocks()) {
    down_blocks->push_back(LTX2VideoDownBlock3D(spec, c.resnet_norm_eps, mode));
  }
  const int64_t mid = c.encoder_mid_channels();
  mid_block = register_module("mid_block", LTX2VideoMidBlock3d(mid, c.layers_per_block.back(), c.resnet_norm_eps,
                                                               /*timestep_conditioning=*/false, mode));
  conv_out = register_module("conv_out", LTX2VideoCausalConv3d(mid, c.latent_channels + 1, 3, mode));
}

at::Tensor LTX2VideoEncoder3dImpl::forward(const at::Tensor& x, LayerOps& ops) {
  // LTX2VideoEncoder3d's patchify (patch_size_t 1) has Wan 2.2's channel order.
  at::Tensor h = conv_in->forward(nn::Patchify(x, patch_size_), ops, causal_);
  for (const auto& block : *down_blocks) h = block->as<LTX2VideoDownBlock3DImpl>()->forward(h, ops, causal_);
  h = mid_block->forward(h, ops, at::Tensor(), causal_);
  h = conv_out->forward(at::silu(PerChannelRMSNorm(h)), ops, causal_);  // [B, C + 1, T', h, w]
  const int64_t c = h.size(1) - 1;
  return at::cat({h.narrow(1, 0, c), h.narrow(1, c, 1).expand({-1, c, -1, -1, -1})}, 1);
}

LTX2VideoDecoder3dImpl::LTX2VideoDecoder3dImpl(const LTX2Config& c)
    : causal_(c.decoder_causal), patch_size_(c.patch_size) {
  const int64_t mid = c.mid_channels();
  conv_in = register_module("conv_in", LTX2VideoCausalConv3d(c.latent_channels, mid, 3, c.spatial_padding));
  mid_block = register_module("mid_block", LTX2VideoMidBlock3d(mid, c.mid_layers(), c.resnet_norm_eps,
                                                               c.timestep_conditioning, c.spatial_padding));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (const UpBlockSpec& spec : c.UpBlocks()) {
    up_blocks->push_back(LTX2VideoUpBlock3d(spec, c.resnet_norm_eps, c.timestep_conditioning, c.spatial_padding));
  }
  const int64_t last = c.final_channels();
  conv_out = register_module(
      "conv_out", LTX2VideoCausalConv3d(last, c.out_channels * c.patch_size * c.patch_size, 3, c.spatial_padding));
  if (c.timestep_conditioning) {
    timestep_scale_multiplier = register_parameter("timestep_scale_multiplier", at::full({}, 1000.0f));
    time_embedder = register_module("time_embedder", TimestepEmbedder(last * 2));
    scale_shift_table = register_parameter("scale_shift_table", at::zeros({2, last}));
  }
}

at::Tensor LTX2VideoDecoder3dImpl::forward(const at::Tensor& z, LayerOps& ops, const at::Tensor& timestep,
                                           nn::CausalFrames* stream) {
  at::Tensor h = conv_in->forward(z, ops, causal_, stream);
  at::Tensor t = timestep;
  if (timestep_scale_multiplier.defined()) t = t * timestep_scale_multiplier;
  h = mid_block->forward(h, ops, t, causal_, stream);
  for (const auto& block : *up_blocks) h = block->as<LTX2VideoUpBlock3dImpl>()->forward(h, ops, t, causal_, stream);
  h = PerChannelRMSNorm(h);
  if (time_embedder) {
    const int64_t b = h.size(0), c = scale_shift_table.size(1);
    const at::Tensor e = time_embedder->forward(t.flatten(), h.scalar_type()).view({b, 2, c, 1, 1, 1}) +
                         scale_shift_table.view({1, 2, c, 1, 1, 1});
    h = Modulate(h, /*shift=*/e.select(1, 0), /*scale=*/e.select(1, 1));
  }
  h = conv_out->forward(at::silu(h), ops, causal_, stream);  // [B, C·p·p, F, H, W]
  // LTX2VideoDecoder3d's unpatchify (patch_size_t 1) has Wan 2.2's channel order.
  return nn::Unpatchify(h, patch_size_);
}

}  // namespace vaedecode::families::ltx2
