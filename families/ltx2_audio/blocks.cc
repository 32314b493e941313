#include "families/ltx2_audio/blocks.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

namespace vaedecode::families::ltx2_audio {
namespace {

constexpr double kNormEps = 1e-6;
constexpr int64_t kGroupNormGroups = 32;

bool Attends(const LTX2AudioConfig& c, int64_t resolution) {
  return std::find(c.attn_resolutions.begin(), c.attn_resolutions.end(), resolution) != c.attn_resolutions.end();
}

template <typename T>
T* As(const std::shared_ptr<torch::nn::Module>& m) {
  return m->as<T>();
}

}  // namespace

CausalConv2dImpl::CausalConv2dImpl(int64_t in, int64_t out, int64_t kernel, CausalityAxis axis) {
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)));
  const int64_t pad = kernel - 1;  // both axes (dilation 1)
  switch (axis) {
    case CausalityAxis::kNone:
      padding_ = {pad / 2, pad - pad / 2, pad / 2, pad - pad / 2};
      break;
    case CausalityAxis::kWidth:
    case CausalityAxis::kWidthCompatibility:
      padding_ = {pad, 0, pad / 2, pad - pad / 2};
      break;
    case CausalityAxis::kHeight:
      padding_ = {pad / 2, pad - pad / 2, pad, 0};
      break;
  }
}

at::Tensor CausalConv2dImpl::forward(const at::Tensor& x) {
  return conv->forward(at::constant_pad_nd(x, {padding_[0], padding_[1], padding_[2], padding_[3]}, 0));
}

torch::nn::GroupNorm MakeNorm(const LTX2AudioConfig& config, int64_t channels) {
  if (!config.group_norm) return nullptr;
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(kGroupNormGroups, channels).eps(kNormEps).affine(true));
}

at::Tensor RunNorm(const torch::nn::GroupNorm& norm, const at::Tensor& x) {
  if (norm) return torch::nn::GroupNorm(norm)->forward(x);  // forward is non-const
  return x / at::sqrt(at::mean(x.pow(2), {1}, /*keepdim=*/true) + kNormEps);
}

ResnetBlockImpl::ResnetBlockImpl(const LTX2AudioConfig& c, int64_t in, int64_t out) {
  if (torch::nn::GroupNorm n = MakeNorm(c, in)) norm1 = register_module("norm1", n);
  conv1 = register_module("conv1", CausalConv2d(in, out, 3, c.causality_axis));
  if (torch::nn::GroupNorm n = MakeNorm(c, out)) norm2 = register_module("norm2", n);
  conv2 = register_module("conv2", CausalConv2d(out, out, 3, c.causality_axis));
  if (in != out) nin_shortcut = register_module("nin_shortcut", CausalConv2d(in, out, 1, c.causality_axis));
}

at::Tensor ResnetBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv1->forward(at::silu(RunNorm(norm1, x)));
  h = conv2->forward(at::silu(RunNorm(norm2, h)));  // dropout: inference
  return (nin_shortcut ? nin_shortcut->forward(x) : x) + h;
}

AttnBlockImpl::AttnBlockImpl(const LTX2AudioConfig& c, int64_t channels) {
  if (torch::nn::GroupNorm n = MakeNorm(c, channels)) norm = register_module("norm", n);
  const auto one_by_one = [&](const char* name) {
    return register_module(name, torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 1)));
  };
  q = one_by_one("q");
  k = one_by_one("k");
  v = one_by_one("v");
  proj_out = one_by_one("proj_out");
}

at::Tensor AttnBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = RunNorm(norm, x);
  const int64_t b = x.size(0), c = x.size(1), height = x.size(2), width = x.size(3);
  const at::Tensor query = q->forward(h).reshape({b, c, height * width}).permute({0, 2, 1});  // [B, HW, C]
  const at::Tensor key = k->forward(h).reshape({b, c, height * width});                       // [B, C, HW]
  const at::Tensor value = v->forward(h).reshape({b, c, height * width});
  const at::Tensor attn = at::softmax(at::bmm(query, key) * std::pow(static_cast<double>(c), -0.5), 2);
  const at::Tensor out = at::bmm(value, attn.permute({0, 2, 1})).reshape({b, c, height, width});
  return x + proj_out->forward(out);
}

UpsampleImpl::UpsampleImpl(const LTX2AudioConfig& c, int64_t channels) : axis_(c.causality_axis) {
  conv = register_module("conv", CausalConv2d(channels, channels, 3, c.causality_axis));
}

at::Tensor UpsampleImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv->forward(at::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2}));
  if (axis_ == CausalityAxis::kHeight) return h.narrow(2, 1, h.size(2) - 1);
  if (axis_ == CausalityAxis::kWidth) return h.narrow(3, 1, h.size(3) - 1);
  return h;  // none and width-compatibility crop nothing
}

DownsampleImpl::DownsampleImpl(const LTX2AudioConfig& c, int64_t channels) : axis_(c.causality_axis) {
  conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).stride(2)));
}

at::Tensor DownsampleImpl::forward(const at::Tensor& x) {
  std::vector<int64_t> pad;  // (left, right, top, bottom)
  switch (axis_) {
    case CausalityAxis::kNone:
      pad = {0, 1, 0, 1};
      break;
    case CausalityAxis::kWidth:
      pad = {2, 0, 0, 1};
      break;
    case CausalityAxis::kHeight:
      pad = {0, 1, 2, 0};
      break;
    case CausalityAxis::kWidthCompatibility:
      pad = {1, 0, 0, 1};
      break;
  }
  return conv->forward(at::constant_pad_nd(x, pad, 0));
}

at::Tensor LevelImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < block->size(); ++i) {
    h = As<ResnetBlockImpl>(block[i])->forward(h);
    if (!attn->is_empty()) h = As<AttnBlockImpl>(attn[i])->forward(h);
  }
  if (upsample) h = upsample->forward(h);
  if (downsample) h = downsample->forward(h);
  return h;
}

MidImpl::MidImpl(const LTX2AudioConfig& c, int64_t channels) {
  block_1 = register_module("block_1", ResnetBlock(c, channels, channels));
  if (c.mid_block_add_attention) attn_1 = register_module("attn_1", AttnBlock(c, channels));
  block_2 = register_module("block_2", ResnetBlock(c, channels, channels));
}

at::Tensor MidImpl::forward(const at::Tensor& x) {
  at::Tensor h = block_1->forward(x);
  if (attn_1) h = attn_1->forward(h);
  return block_2->forward(h);
}

AudioDecoderImpl::AudioDecoderImpl(const LTX2AudioConfig& c) : config_(c) {
  const int64_t levels = c.levels();
  int64_t block_in = c.base_channels * c.ch_mult.back();
  conv_in = register_module("conv_in", CausalConv2d(c.latent_channels, block_in, 3, c.causality_axis));
  mid = register_module("mid", Mid(c, block_in));
  // Built from the last level to the first, as the channels flow; up[level] indexes by level.
  std::vector<Level> stages(levels);
  int64_t resolution = c.resolution >> (levels - 1);
  for (int64_t level = levels - 1; level >= 0; --level) {
    Level stage;
    stage->block = stage->register_module("block", torch::nn::ModuleList());
    stage->attn = stage->register_module("attn", torch::nn::ModuleList());
    const int64_t block_out = c.base_channels * c.ch_mult[level];
    for (int64_t j = 0; j < c.num_res_blocks + 1; ++j) {
      stage->block->push_back(ResnetBlock(c, block_in, block_out));
      block_in = block_out;
      if (Attends(c, resolution)) stage->attn->push_back(AttnBlock(c, block_in));
    }
    if (level != 0) {
      stage->upsample = stage->register_module("upsample", Upsample(c, block_in));
      resolution *= 2;
    }
    stages[level] = stage;
  }
  up = register_module("up", torch::nn::ModuleList());
  for (const Level& stage : stages) up->push_back(stage);
  if (torch::nn::GroupNorm n = MakeNorm(c, block_in)) norm_out = register_module("norm_out", n);
  conv_out = register_module("conv_out", CausalConv2d(block_in, c.output_channels, 3, c.causality_axis));
}

at::Tensor AudioDecoderImpl::forward(const at::Tensor& z) {
  const int64_t target_frames = config_.MelFrames(z.size(2));
  const int64_t target_bins = config_.mel_bins > 0 ? config_.mel_bins : z.size(3);
  at::Tensor h = mid->forward(conv_in->forward(z));
  for (int64_t level = config_.levels() - 1; level >= 0; --level) h = As<LevelImpl>(up[level])->forward(h);
  h = conv_out->forward(at::silu(RunNorm(norm_out, h)));
  // Cropped to the target, then zero-padded up to it (bottom and right).
  h = h.narrow(2, 0, std::min(h.size(2), target_frames)).narrow(3, 0, std::min(h.size(3), target_bins));
  if (h.size(2) < target_frames || h.size(3) < target_bins) {
    h = at::constant_pad_nd(h, {0, target_bins - h.size(3), 0, target_frames - h.size(2)}, 0);
  }
  return h;
}

AudioEncoderImpl::AudioEncoderImpl(const LTX2AudioConfig& c) : config_(c) {
  int64_t block_in = c.base_channels;
  conv_in = register_module("conv_in", CausalConv2d(c.in_channels, block_in, 3, c.causality_axis));
  down = register_module("down", torch::nn::ModuleList());
  int64_t resolution = c.resolution;
  for (int64_t level = 0; level < c.levels(); ++level) {
    Level stage;
    stage->block = stage->register_module("block", torch::nn::ModuleList());
    stage->attn = stage->register_module("attn", torch::nn::ModuleList());
    const int64_t block_out = c.base_channels * c.ch_mult[level];
    for (int64_t j = 0; j < c.num_res_blocks; ++j) {
      stage->block->push_back(ResnetBlock(c, block_in, block_out));
      block_in = block_out;
      if (Attends(c, resolution)) stage->attn->push_back(AttnBlock(c, block_in));
    }
    if (level != c.levels() - 1) {
      stage->downsample = stage->register_module("downsample", Downsample(c, block_in));
      resolution /= 2;
    }
    down->push_back(stage);
  }
  mid = register_module("mid", Mid(c, block_in));
  if (torch::nn::GroupNorm n = MakeNorm(c, block_in)) norm_out = register_module("norm_out", n);
  const int64_t z_channels = c.double_z ? 2 * c.latent_channels : c.latent_channels;
  conv_out = register_module("conv_out", CausalConv2d(block_in, z_channels, 3, c.causality_axis));
}

at::Tensor AudioEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in->forward(x);
  for (size_t level = 0; level < down->size(); ++level) h = As<LevelImpl>(down[level])->forward(h);
  h = mid->forward(h);
  return conv_out->forward(at::silu(RunNorm(norm_out, h)));
}

}  // namespace vaedecode::families::ltx2_audio
