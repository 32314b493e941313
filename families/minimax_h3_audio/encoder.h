#pragma once

// MiniMax-H3 audio's encode side: AutoencoderKLMiniMaxH3Audio.encode of mono
// waveforms [B, 1, samples] (stereo as a batch of 2), right-padded with zeros
// to whole hops, through the DAC encoder and the causal-attention pre_block
// to the posterior [B, latent_channels, ceil(samples / hop)]. Its posterior
// heads give a mean and a log standard deviation (mean_proj, logs_proj):
// Moments returns the log-variance 2·logs, so the sample is
// mean + exp(logs)·noise as diffusers draws it while logs is within
// [-15, 10] (DiagonalGaussian's clamp of the log-variance to [-30, 20],
// which diffusers' own log-std posterior does not apply). `raw` is the pipeline's
// (mean - latents_mean) / latents_std per channel. Dense, float32, on one
// process.

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/minimax_h3_audio/blocks.h"
#include "families/minimax_h3_audio/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::minimax_h3_audio {

// The encode-side state dict: encoder.*, pre_block.*, mean_proj.*, logs_proj.*.
class MiniMaxH3AudioEncodeModuleImpl : public torch::nn::Module {
 public:
  explicit MiniMaxH3AudioEncodeModuleImpl(const MiniMaxH3AudioConfig& config);

  DacSequence encoder{nullptr};
  AttnProjection pre_block{nullptr};
  torch::nn::Conv1d mean_proj{nullptr}, logs_proj{nullptr};
};
TORCH_MODULE(MiniMaxH3AudioEncodeModule);

class MiniMaxH3AudioEncoder final : public ModuleBackedEncoder {
 public:
  using Config = MiniMaxH3AudioConfig;
  explicit MiniMaxH3AudioEncoder(MiniMaxH3AudioConfig config);

  absl::Status ValidateImage(const at::Tensor& waveform) const override;  // [B, 1, samples]
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& waveform_shape) const override;
  at::Tensor Moments(const at::Tensor& waveform, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;
  absl::Status CheckRawLatentShape(const std::vector<int64_t>& latent_shape) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  MiniMaxH3AudioConfig config_;
  MiniMaxH3AudioEncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadMiniMaxH3AudioEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::minimax_h3_audio
