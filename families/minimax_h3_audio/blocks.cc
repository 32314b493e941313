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

Snake1dImpl::Snake1dImpl(int64_t channels) { alpha = register_parameter("alpha", at::ones({1, channels, 1})); }

at::Tensor Snake1dImpl::forward(const at::Tensor& x) {
  return x + at::reciprocal(alpha + 1e-9) * at::sin(alpha * x).pow(2);
}

DacSequenceImpl::DacSequenceImpl() { block = register_module("block", torch::nn::ModuleList()); }

at::Tensor DacSequenceImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (const auto& m : *block) {
    if (auto* snake = m->as<Snake1dImpl>()) {
      h = snake->forward(h);
    } else if (auto* conv = m->as<WeightNormConv1dImpl>()) {
      h = conv->forward(h);
    } else {
      h = m->as<DacSequenceImpl>()->forward(h);
    }
  }
  if (!residual) return h;
  // A residual unit: the input centre-cropped to the block's length, plus the block.
  const int64_t pad = (x.size(-1) - h.size(-1)) / 2;
  return (pad > 0 ? x.narrow(-1, pad, x.size(-1) - 2 * pad) : x) + h;
}

namespace {

WeightNormConv1d DacConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return WeightNormConv1d(WeightNormConv1dImpl::Options{in, out, kernel, stride, padding, dilation, true, false});
}

// MiniMaxH3AudioResidualUnit: Snake, dilated k7 conv, Snake, k1 conv, plus the (cropped) input.
DacSequence ResidualUnit(int64_t dim, int64_t dilation) {
  DacSequence unit;
  unit->residual = true;
  unit->block->push_back(Snake1d(dim));
  unit->block->push_back(DacConv(dim, dim, 7, 1, (7 - 1) * dilation / 2, dilation));
  unit->block->push_back(Snake1d(dim));
  unit->block->push_back(DacConv(dim, dim, 1, 1, 0, 1));
  return unit;
}

}  // namespace

DacSequence MakeDacEncoder(const MiniMaxH3AudioConfig& c) {
  DacSequence encoder;
  int64_t dim = c.encoder_dim;
  encoder->block->push_back(DacConv(1, dim, 7, 1, 3, 1));
  for (int64_t stride : c.encoder_rates) {
    dim *= 2;
    // MiniMaxH3AudioEncoderBlock: residual units at dilations 1, 3, 9, Snake, a strided conv doubling the width.
    DacSequence stage;
    for (int64_t dilation : {1, 3, 9}) stage->block->push_back(ResidualUnit(dim / 2, dilation));
    stage->block->push_back(Snake1d(dim / 2));
    stage->block->push_back(DacConv(dim / 2, dim, 2 * stride, stride, (stride + 1) / 2, 1));
    encoder->block->push_back(stage);
  }
  encoder->block->push_back(Snake1d(dim));
  encoder->block->push_back(DacConv(dim, c.latent_dim, 3, 1, 1, 1));
  return encoder;
}

AttnProjectionImpl::AttnProjectionImpl(int64_t in_dim, int64_t out_dim, int64_t heads)
    : heads_(heads), out_dim_(out_dim) {
  const auto layer_norm = [](int64_t dim) { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})); };
  norm1 = register_module("norm1", layer_norm(in_dim));
  attn = register_module("attn", std::make_shared<torch::nn::Module>());
  qkv = attn->register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(in_dim, 3 * in_dim).bias(false)));
  q_bias = attn->register_parameter("q_bias", at::zeros({in_dim}));
  v_bias = attn->register_parameter("v_bias", at::zeros({in_dim}));
  zero_k_bias = attn->register_buffer("zero_k_bias", at::zeros({in_dim}));
  attn_proj = attn->register_module("proj", torch::nn::Linear(out_dim, out_dim));
  proj = register_module("proj", torch::nn::Linear(in_dim, out_dim));
  norm3 = register_module("norm3", layer_norm(in_dim));
  norm2 = register_module("norm2", layer_norm(out_dim));
  mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  mlp_norm = mlp->register_module("norm", layer_norm(out_dim));
  w0 = mlp->register_module("w0", torch::nn::Linear(out_dim, 2 * out_dim));
  w1 = mlp->register_module("w1", torch::nn::Linear(out_dim, 2 * out_dim));
  w2 = mlp->register_module("w2", torch::nn::Linear(2 * out_dim, out_dim));
}

at::Tensor AttnProjectionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), l = x.size(1), width = x.size(2), head_dim = width / heads_;
  // MiniMaxH3AudioAttnProcessor: one fused projection, the key's bias zero.
  const at::Tensor a = norm1->forward(x);
  const at::Tensor fused = at::linear(a, qkv->weight, at::cat({q_bias, zero_k_bias, v_bias}));
  const std::vector<at::Tensor> qkv_parts =
      fused.reshape({b, l, 3, heads_, head_dim}).permute({2, 0, 3, 1, 4}).unbind(0);
  at::Tensor attended = at::scaled_dot_product_attention(qkv_parts[0], qkv_parts[1], qkv_parts[2], {}, 0.0,
                                                         /*is_causal=*/true);  // [B, H, L, D]
  attended = at::adaptive_avg_pool1d(attended.mean(1), {out_dim_});            // heads averaged, D pooled: [B, L, out]
  const at::Tensor h = proj->forward(norm3->forward(x)) + attn_proj->forward(attended);
  const at::Tensor n = mlp_norm->forward(norm2->forward(h));
  return h + w2->forward(at::gelu(w0->forward(n), "tanh") * w1->forward(n));
}

}  // namespace vaedecode::families::minimax_h3_audio
