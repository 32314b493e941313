#include "families/ltx2_audio/vocoder.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/conv.h>

namespace vaedecode::families::ltx2_audio {
namespace {

// nn.LeakyReLU()'s default: the vocoder's act_out ignores the configured slope, as the original code does.
constexpr double kActOutSlope = 0.01;

torch::nn::Conv1d SameConv1d(int64_t channels, int64_t kernel, int64_t dilation) {
  return torch::nn::Conv1d(
      torch::nn::Conv1dOptions(channels, channels, kernel).dilation(dilation).padding(torch::kSame));
}

// One activation of a ResBlock: a bare SnakeBeta (acts1.<i>.alpha) or an anti-aliased one.
std::shared_ptr<torch::nn::Module> MakeActivation(const LTX2VocoderConfig& c, int64_t channels) {
  const bool use_beta = c.act_fn == "snakebeta";
  if (c.antialias) return AntiAliasAct(channels, use_beta, c.antialias_ratio, c.antialias_kernel_size).ptr();
  return nn::SnakeBeta(channels, use_beta).ptr();
}

}  // namespace

SincFilterImpl::SincFilterImpl(int64_t taps) { filter = register_buffer("filter", at::zeros({1, 1, taps})); }

AntiAliasActImpl::AntiAliasActImpl(int64_t channels, bool use_beta, int64_t ratio, int64_t taps) : ratio_(ratio) {
  upsample = register_module("upsample", SincFilter(taps));
  act = register_module("act", nn::SnakeBeta(channels, use_beta));
  downsample = register_module("downsample", SincFilter(taps));
}

at::Tensor AntiAliasActImpl::forward(const at::Tensor& x) {
  return nn::LowPassDownsample1d(act->forward(nn::AntiAliasUpsample1d(x, upsample->filter, ratio_)), downsample->filter,
                                 ratio_);
}

ResBlockImpl::ResBlockImpl(const LTX2VocoderConfig& c, int64_t channels, int64_t kernel,
                           const std::vector<int64_t>& dilations)
    : slope_(c.leaky_relu_negative_slope) {
  convs1 = register_module("convs1", torch::nn::ModuleList());
  convs2 = register_module("convs2", torch::nn::ModuleList());
  acts1 = register_module("acts1", torch::nn::ModuleList());
  acts2 = register_module("acts2", torch::nn::ModuleList());
  for (int64_t d : dilations) {
    convs1->push_back(SameConv1d(channels, kernel, d));
    convs2->push_back(SameConv1d(channels, kernel, 1));
    if (c.snake()) {
      acts1->push_back(MakeActivation(c, channels));
      acts2->push_back(MakeActivation(c, channels));
    }
  }
}

at::Tensor ResBlockImpl::Activate(const torch::nn::ModuleList& acts, size_t i, const at::Tensor& x) const {
  if (acts->is_empty()) return at::leaky_relu(x, slope_);
  if (auto* aa = acts->ptr(i)->as<AntiAliasActImpl>()) return aa->forward(x);
  return acts->ptr(i)->as<nn::SnakeBetaImpl>()->forward(x);
}

at::Tensor ResBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < convs1->size(); ++i) {
    at::Tensor t = convs1[i]->as<torch::nn::Conv1dImpl>()->forward(Activate(acts1, i, h));
    t = convs2[i]->as<torch::nn::Conv1dImpl>()->forward(Activate(acts2, i, t));
    h = h + t;
  }
  return h;
}

VocoderImpl::VocoderImpl(const LTX2VocoderConfig& c) : config_(c) {
  conv_in = register_module(
      "conv_in", torch::nn::Conv1d(torch::nn::Conv1dOptions(c.in_channels, c.hidden_channels, 7).padding(3)));
  upsamplers = register_module("upsamplers", torch::nn::ModuleList());
  resnets = register_module("resnets", torch::nn::ModuleList());
  int64_t channels = c.hidden_channels;
  for (size_t i = 0; i < c.upsample_factors.size(); ++i) {
    const int64_t f = c.upsample_factors[i], k = c.upsample_kernel_sizes[i];
    upsamplers->push_back(torch::nn::ConvTranspose1d(
        torch::nn::ConvTranspose1dOptions(channels, channels / 2, k).stride(f).padding((k - f) / 2)));
    channels /= 2;
    for (size_t j = 0; j < c.resnet_kernel_sizes.size(); ++j) {
      resnets->push_back(ResBlock(c, channels, c.resnet_kernel_sizes[j], c.resnet_dilations[j]));
    }
  }
  // Snake vocoders always anti-alias act_out, with beta.
  if (c.snake()) {
    act_out = register_module("act_out", AntiAliasAct(channels, true, c.antialias_ratio, c.antialias_kernel_size));
  }
  conv_out = register_module(
      "conv_out",
      torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, c.out_channels, 7).padding(3).bias(c.final_bias)));
}

at::Tensor VocoderImpl::forward(const at::Tensor& mel) {
  // [B, C, T, M] -> [B, C·M, T], channel-major.
  at::Tensor h = conv_in->forward(mel.transpose(2, 3).flatten(1, 2));
  const size_t per_stage = config_.resnet_kernel_sizes.size();
  for (size_t i = 0; i < upsamplers->size(); ++i) {
    if (!config_.snake()) h = at::leaky_relu(h, config_.leaky_relu_negative_slope);
    h = upsamplers[i]->as<torch::nn::ConvTranspose1dImpl>()->forward(h);
    // The mean of the stage's resnets, as torch.stack(...).mean(0) sums them.
    std::vector<at::Tensor> outs;
    for (size_t j = 0; j < per_stage; ++j) outs.push_back(resnets[i * per_stage + j]->as<ResBlockImpl>()->forward(h));
    h = at::mean(at::stack(outs, 0), 0);
  }
  h = act_out ? act_out->forward(h) : at::leaky_relu(h, kActOutSlope);
  h = conv_out->forward(h);
  if (config_.final_act_fn == "tanh") return at::tanh(h);
  if (config_.final_act_fn == "clamp") return at::clamp(h, -1.0, 1.0);
  return h;
}

}  // namespace vaedecode::families::ltx2_audio
