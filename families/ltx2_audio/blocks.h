#pragma once

// LibTorch mirrors of diffusers' AutoencoderKLLTX2Audio blocks
// (autoencoders/autoencoder_kl_ltx2_audio.py), children under the diffusers
// attribute names so named_parameters() equals its state-dict keys. They
// work on mel spectrograms [B, C, frames, mel_bins] ("height" is time,
// "width" the mel bins).
//
// Audio is decoded densely on one process (its latents are small): nothing
// here runs through LayerOps.

#include <array>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "families/ltx2_audio/config.h"

namespace vaedecode::families::ltx2_audio {

// LTX2AudioCausalConv2d (stride 1): zero padding (left, right, top, bottom)
// by the causality axis, then `conv` unpadded.
class CausalConv2dImpl : public torch::nn::Module {
 public:
  CausalConv2dImpl(int64_t in, int64_t out, int64_t kernel, CausalityAxis axis);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv{nullptr};

 private:
  std::array<int64_t, 4> padding_;
};
TORCH_MODULE(CausalConv2d);

// The config's normalisation: GroupNorm(32, eps 1e-6) with parameters, or
// LTX2AudioPixelNorm (x / sqrt(mean over channels of x² + 1e-6), none).
torch::nn::GroupNorm MakeNorm(const LTX2AudioConfig& config, int64_t channels);  // nullptr for pixel
at::Tensor RunNorm(const torch::nn::GroupNorm& norm, const at::Tensor& x);

// LTX2AudioResnetBlock: x + conv2(silu(norm2(conv1(silu(norm1(x)))))), the
// skip through `nin_shortcut` (a causal 1x1) when the widths differ.
class ResnetBlockImpl : public torch::nn::Module {
 public:
  ResnetBlockImpl(const LTX2AudioConfig& config, int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  CausalConv2d conv1{nullptr}, conv2{nullptr}, nin_shortcut{nullptr};
};
TORCH_MODULE(ResnetBlock);

// LTX2AudioAttnBlock: one head over every (frame, bin), 1x1 q/k/v/proj_out.
class AttnBlockImpl : public torch::nn::Module {
 public:
  AttnBlockImpl(const LTX2AudioConfig& config, int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(AttnBlock);

// LTX2AudioUpsample: nearest 2x, a causal 3x3, then the first row (height)
// or column (width) dropped.
class UpsampleImpl : public torch::nn::Module {
 public:
  UpsampleImpl(const LTX2AudioConfig& config, int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  CausalConv2d conv{nullptr};

 private:
  CausalityAxis axis_;
};
TORCH_MODULE(Upsample);

// LTX2AudioDownsample: zero padding by the axis, a 3x3 conv of stride 2.
class DownsampleImpl : public torch::nn::Module {
 public:
  DownsampleImpl(const LTX2AudioConfig& config, int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv{nullptr};

 private:
  CausalityAxis axis_;
};
TORCH_MODULE(Downsample);

// One resolution of the encoder (down.<i>) or decoder (up.<i>): its resnets,
// an attention after each when the level attends, and the resampler.
class LevelImpl : public torch::nn::Module {
 public:
  LevelImpl() = default;
  at::Tensor forward(const at::Tensor& x);  // blocks (and attentions), then the resampler

  torch::nn::ModuleList block{nullptr};
  torch::nn::ModuleList attn{nullptr};
  Upsample upsample{nullptr};
  Downsample downsample{nullptr};
};
TORCH_MODULE(Level);

// mid: block_1, attn_1 (mid_block_add_attention), block_2.
class MidImpl : public torch::nn::Module {
 public:
  MidImpl(const LTX2AudioConfig& config, int64_t channels);
  at::Tensor forward(const at::Tensor& x);

  ResnetBlock block_1{nullptr}, block_2{nullptr};
  AttnBlock attn_1{nullptr};
};
TORCH_MODULE(Mid);

// LTX2AudioDecoder: latent [B, latent_channels, L, M] -> mel spectrogram
// [B, output_channels, max(4L - 3, 1), mel_bins (or M when null)], cropped or
// zero-padded to that size as diffusers does.
class AudioDecoderImpl : public torch::nn::Module {
 public:
  explicit AudioDecoderImpl(const LTX2AudioConfig& config);
  at::Tensor forward(const at::Tensor& z);

  CausalConv2d conv_in{nullptr};
  Mid mid{nullptr};
  torch::nn::ModuleList up{nullptr};  // up[level]: run from the last level to the first
  torch::nn::GroupNorm norm_out{nullptr};
  CausalConv2d conv_out{nullptr};

 private:
  LTX2AudioConfig config_;
};
TORCH_MODULE(AudioDecoder);

// LTX2AudioEncoder: mel spectrogram [B, in_channels, T, mel_bins] ->
// moments [B, 2·latent_channels (double_z) or latent_channels, L, M].
class AudioEncoderImpl : public torch::nn::Module {
 public:
  explicit AudioEncoderImpl(const LTX2AudioConfig& config);
  at::Tensor forward(const at::Tensor& x);

  CausalConv2d conv_in{nullptr};
  torch::nn::ModuleList down{nullptr};
  Mid mid{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
  CausalConv2d conv_out{nullptr};

 private:
  LTX2AudioConfig config_;
};
TORCH_MODULE(AudioEncoder);

}  // namespace vaedecode::families::ltx2_audio
