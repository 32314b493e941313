#pragma once

// LibTorch mirror of diffusers' LTX2Vocoder (pipelines/ltx2/vocoder.py):
// LTX-2's mel spectrogram [B, 2, frames, mel_bins] -> stereo waveform
// [B, out_channels, frames · prod(upsample_factors)] at output_sampling_rate,
// parameters under its state-dict names (the folder's vocoder/ checkpoint).
// LTX2VocoderWithBWE (LTX-2.3's bandwidth extension) is not this class.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "families/ltx2_audio/config.h"
#include "families/nn/modules.h"

namespace vaedecode::families::ltx2_audio {

// A module holding one Kaiser-sinc `filter` buffer [1, 1, taps].
class SincFilterImpl : public torch::nn::Module {
 public:
  explicit SincFilterImpl(int64_t taps);
  at::Tensor filter;
};
TORCH_MODULE(SincFilter);

// diffusers' AntiAliasAct1d around a SnakeBeta: `upsample`, `act`, `downsample`.
class AntiAliasActImpl : public torch::nn::Module {
 public:
  AntiAliasActImpl(int64_t channels, bool use_beta, int64_t ratio, int64_t taps);
  at::Tensor forward(const at::Tensor& x);

  SincFilter upsample{nullptr};
  nn::SnakeBeta act{nullptr};
  SincFilter downsample{nullptr};

 private:
  int64_t ratio_;
};
TORCH_MODULE(AntiAliasAct);

// diffusers' vocoder ResBlock: per dilation, x + conv2(act2(conv1(act1(x)))),
// "same"-padded convs; leaky ReLU (no modules) or Snake/SnakeBeta, each
// anti-aliased when the config says so.
class ResBlockImpl : public torch::nn::Module {
 public:
  ResBlockImpl(const LTX2VocoderConfig& config, int64_t channels, int64_t kernel,
               const std::vector<int64_t>& dilations);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList convs1{nullptr}, convs2{nullptr};
  torch::nn::ModuleList acts1{nullptr}, acts2{nullptr};  // empty for leaky_relu

 private:
  at::Tensor Activate(const torch::nn::ModuleList& acts, size_t i, const at::Tensor& x) const;
  double slope_;
};
TORCH_MODULE(ResBlock);

class VocoderImpl : public torch::nn::Module {
 public:
  explicit VocoderImpl(const LTX2VocoderConfig& config);
  // mel [B, C, frames, bins] (C · bins = in_channels) -> [B, out_channels, samples].
  at::Tensor forward(const at::Tensor& mel);

  torch::nn::Conv1d conv_in{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // ConvTranspose1d each
  torch::nn::ModuleList resnets{nullptr};     // resnet_kernel_sizes of them per upsampler
  AntiAliasAct act_out{nullptr};              // snake/snakebeta only; leaky_relu (slope 0.01) otherwise
  torch::nn::Conv1d conv_out{nullptr};

 private:
  LTX2VocoderConfig config_;
};
TORCH_MODULE(Vocoder);

}  // namespace vaedecode::families::ltx2_audio
