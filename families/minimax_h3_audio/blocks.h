#pragma once

// LibTorch mirrors of the decode side of diffusers' AutoencoderKLMiniMaxH3Audio
// (autoencoders/autoencoder_kl_minimax_h3_audio.py), children under the
// diffusers attribute names so named_parameters() and named_buffers() equal
// its state-dict keys: weight-normed convs keep `weight_g` / `weight_v`
// (the weight is g · v / ‖v‖, the norm over every dim but 0, computed per
// call), the anti-aliased activations their Kaiser-sinc `filter` buffers,
// which are loaded from the checkpoint as they are.
//
// Audio is decoded densely on one process (its latents are small): nothing
// here runs through LayerOps.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/minimax_h3_audio/config.h"
#include "families/nn/modules.h"

namespace vaedecode::families::minimax_h3_audio {

// torch.nn.utils.weight_norm(nn.Conv1d / nn.ConvTranspose1d): parameters
// weight_g [dim 0, 1, 1], weight_v (the conv's weight shape) and bias.
class WeightNormConv1dImpl : public torch::nn::Module {
 public:
  struct Options {
    int64_t in = 0, out = 0, kernel = 1, stride = 1, padding = 0, dilation = 1;
    bool bias = true;
    bool transposed = false;  // ConvTranspose1d: weight [in, out, k], g over the input channels
  };
  explicit WeightNormConv1dImpl(const Options& options);
  at::Tensor forward(const at::Tensor& x);  // [B, in, L] -> [B, out, L']

  at::Tensor weight_g, weight_v, bias;

 private:
  Options options_;
};
TORCH_MODULE(WeightNormConv1d);

using nn::SnakeBeta;

// A module holding one Kaiser-sinc `filter` buffer [1, 1, taps].
class FilterImpl : public torch::nn::Module {
 public:
  FilterImpl();
  at::Tensor filter;
};
TORCH_MODULE(Filter);

// diffusers MiniMaxH3AudioDownSample1d: its filter sits under `lowpass`.
class DownSample1dImpl : public torch::nn::Module {
 public:
  DownSample1dImpl();
  Filter lowpass{nullptr};
};
TORCH_MODULE(DownSample1d);

// diffusers MiniMaxH3AudioActivation1d: 2x anti-aliased upsample (replicate
// padding, a transposed depthwise conv with `upsample.filter`), SnakeBeta,
// 2x low-pass downsample (`downsample.lowpass.filter`). Keeps the length.
class Activation1dImpl : public torch::nn::Module {
 public:
  explicit Activation1dImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  SnakeBeta act{nullptr};
  Filter upsample{nullptr};
  DownSample1d downsample{nullptr};
};
TORCH_MODULE(Activation1d);

// diffusers MiniMaxH3AudioAMPBlock: per dilation d,
// x + conv2(act2(conv1(act1(x)))), conv1 dilated by d.
class AMPBlockImpl : public torch::nn::Module {
 public:
  AMPBlockImpl(int64_t channels, int64_t kernel, const std::vector<int64_t>& dilations);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList convs1{nullptr};
  torch::nn::ModuleList convs2{nullptr};
  torch::nn::ModuleList activations{nullptr};
};
TORCH_MODULE(AMPBlock);

// diffusers MiniMaxH3AudioBigVGANDecoder: [B, latent_dim, L] -> [B, 1, samples], clamped to [-1, 1].
class BigVGANDecoderImpl : public torch::nn::Module {
 public:
  explicit BigVGANDecoderImpl(const MiniMaxH3AudioConfig& config);
  at::Tensor forward(const at::Tensor& x);

  WeightNormConv1d conv_pre{nullptr};
  torch::nn::ModuleList ups{nullptr};  // ups.<i>.0: a one-element list, as the checkpoint nests it
  torch::nn::ModuleList resblocks{nullptr};
  Activation1d activation_post{nullptr};
  WeightNormConv1d conv_post{nullptr};

 private:
  int64_t kernels_per_stage_;
};
TORCH_MODULE(BigVGANDecoder);

// --- The encode side (a DAC encoder, then the causal-attention pre_block) ---

// diffusers MiniMaxH3AudioSnake1d: x + sin²(alpha · x) / (alpha + 1e-9), alpha [1, C, 1] (not log-scaled).
class Snake1dImpl : public torch::nn::Module {
 public:
  explicit Snake1dImpl(int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor alpha;
};
TORCH_MODULE(Snake1d);

// A DAC encoder's children as its nn.Sequential `block` numbers them: Snake1d
// and WeightNormConv1d modules, the residual units and encoder blocks (each a
// `block` of their own) run in order.
class DacSequenceImpl : public torch::nn::Module {
 public:
  DacSequenceImpl();
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList block{nullptr};
  // A residual unit's: x + block(x), x centre-cropped to the block's length.
  bool residual = false;
};
TORCH_MODULE(DacSequence);

// diffusers MiniMaxH3AudioEncoder: [B, 1, samples] -> [B, latent_dim, samples / hop].
DacSequence MakeDacEncoder(const MiniMaxH3AudioConfig& config);

// diffusers MiniMaxH3AudioAttnProjection (`pre_block`), on [B, L, latent_dim]:
// proj(norm3(x)) + attn(norm1(x)) -> [B, L, latent_channels], plus a
// pre-norm GeGLU MLP. The attention is causal, its heads mean-pooled and the
// head width adaptively average-pooled to latent_channels.
class AttnProjectionImpl : public torch::nn::Module {
 public:
  AttnProjectionImpl(int64_t in_dim, int64_t out_dim, int64_t heads);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  std::shared_ptr<torch::nn::Module> attn;  // attn.qkv, attn.q_bias, attn.v_bias, attn.zero_k_bias, attn.proj
  torch::nn::Linear qkv{nullptr}, attn_proj{nullptr}, proj{nullptr};
  at::Tensor q_bias, v_bias, zero_k_bias;
  std::shared_ptr<torch::nn::Module> mlp;  // mlp.norm, mlp.w0, mlp.w1, mlp.w2
  torch::nn::LayerNorm mlp_norm{nullptr};
  torch::nn::Linear w0{nullptr}, w1{nullptr}, w2{nullptr};

 private:
  int64_t heads_, out_dim_;
};
TORCH_MODULE(AttnProjection);

}  // namespace vaedecode::families::minimax_h3_audio
