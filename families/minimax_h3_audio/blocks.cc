#include "families/minimax_h3_audio/blocks.h"

#include <ATen/ATen.h>

namespace vaedecode::families::minimax_h3_audio {
namespace {

constexpr int64_t kRatio = MiniMaxH3AudioConfig::kActivationRatio;
}  // namespace

WeightNormConv1dImpl::WeightNormConv1dImpl(const Options& o) : options_(o) {
  // Conv1d weight [out, in, k], ConvTranspose1d [in, out, k]; g has dim 0's size.
  const int64_t first = o.transposed ? o.in : o.out, second = o.transposed ? o.out : o.in;
  weight_g = register_parameter("weight_g", at::ones({first, 1, 1}));
  weight_v = register_parameter("weight_v", at::zeros({first, second, o.kernel}));
  if (o.bias) bias = register_parameter("bias", at::zeros({o.out}));
}

at::Tensor WeightNormConv1dImpl::forward(const at::Tensor& x) {
  // torch._weight_norm(v, g, dim=0): v · g / ‖v‖, the norm over dims 1 and 2.
  const at::Tensor weight = weight_v * (weight_g / weight_v.norm(2, {1, 2}, /*keepdim=*/true));
  if (options_.transposed) {
    return at::conv_transpose1d(x, weight, bias, {options_.stride}, {options_.padding}, /*output_padding=*/{0},
                                /*groups=*/1, {options_.dilation});
  }
  return at::conv1d(x, weight, bias, {options_.stride}, {options_.padding}, {options_.dilation});
}

FilterImpl::FilterImpl() { filter = register_buffer("filter", at::zeros({1, 1, MiniMaxH3AudioConfig::kFilterTaps})); }

DownSample1dImpl::DownSample1dImpl() { lowpass = register_module("lowpass", Filter()); }

Activation1dImpl::Activation1dImpl(int64_t channels) {
  act = register_module("act", SnakeBeta(channels));
  upsample = register_module("upsample", Filter());
  downsample = register_module("downsample", DownSample1d());
}

at::Tensor Activation1dImpl::forward(const at::Tensor& x) {
  return nn::LowPassDownsample1d(act->forward(nn::AntiAliasUpsample1d(x, upsample->filter, kRatio)),
                                 downsample->lowpass->filter, kRatio);
}

AMPBlockImpl::AMPBlockImpl(int64_t channels, int64_t kernel, const std::vector<int64_t>& dilations) {
  convs1 = register_module("convs1", torch::nn::ModuleList());
  convs2 = register_module("convs2", torch::nn::ModuleList());
  activations = register_module("activations", torch::nn::ModuleList());
  for (int64_t d : dilations) {
    convs1->push_back(WeightNormConv1d(
        WeightNormConv1dImpl::Options{channels, channels, kernel, 1, (kernel * d - d) / 2, d, true, false}));
    convs2->push_back(WeightNormConv1d(
        WeightNormConv1dImpl::Options{channels, channels, kernel, 1, (kernel - 1) / 2, 1, true, false}));
  }
  for (size_t i = 0; i < 2 * dilations.size(); ++i) activations->push_back(Activation1d(channels));
}

at::Tensor AMPBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < convs1->size(); ++i) {
    at::Tensor r =
        convs1[i]->as<WeightNormConv1dImpl>()->forward(activations[2 * i]->as<Activation1dImpl>()->forward(h));
    r = convs2[i]->as<WeightNormConv1dImpl>()->forward(activations[2 * i + 1]->as<Activation1dImpl>()->forward(r));
    h = r + h;
  }
  return h;
}

BigVGANDecoderImpl::BigVGANDecoderImpl(const MiniMaxH3AudioConfig& c)
    : kernels_per_stage_(static_cast<int64_t>(c.resblock_kernel_sizes.size())) {
  conv_pre = register_module("conv_pre", WeightNormConv1d(WeightNormConv1dImpl::Options{c.latent_dim, c.decoder_dim, 7,
                                                                                        1, 3, 1, true, false}));
  ups = register_module("ups", torch::nn::ModuleList());
  resblocks = register_module("resblocks", torch::nn::ModuleList());
  int64_t channels = c.decoder_dim;
  for (size_t i = 0; i < c.decoder_rates.size(); ++i) {
    const int64_t rate = c.decoder_rates[i], kernel = c.decoder_kernel_sizes[i];
    torch::nn::ModuleList stage;
    stage->push_back(WeightNormConv1d(
        WeightNormConv1dImpl::Options{channels, channels / 2, kernel, rate, (kernel - rate) / 2, 1, true, true}));
    ups->push_back(stage);
    channels /= 2;
    for (size_t j = 0; j < c.resblock_kernel_sizes.size(); ++j) {
      resblocks->push_back(AMPBlock(channels, c.resblock_kernel_sizes[j], c.resblock_dilation_sizes[j]));
    }
  }
  activation_post = register_module("activation_post", Activation1d(channels));
  conv_post = register_module(
      "conv_post", WeightNormConv1d(WeightNormConv1dImpl::Options{channels, 1, 7, 1, 3, 1, /*bias=*/false, false}));
}

at::Tensor BigVGANDecoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_pre->forward(x);
  for (size_t i = 0; i < ups->size(); ++i) {
    h = ups[i]->as<torch::nn::ModuleListImpl>()->ptr(0)->as<WeightNormConv1dImpl>()->forward(h);
    at::Tensor sum;
    for (int64_t j = 0; j < kernels_per_stage_; ++j) {
      const at::Tensor block = resblocks[i * kernels_per_stage_ + j]->as<AMPBlockImpl>()->forward(h);
      sum = sum.defined() ? sum + block : block;
    }
    h = sum / static_cast<double>(kernels_per_stage_);
  }
  h = conv_post->forward(activation_post->forward(h));
  return at::clamp(h, -1.0, 1.0);
}

}  // namespace vaedecode::families::minimax_h3_audio
