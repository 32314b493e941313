#pragma once

// The MiniMax-H3 audio family: diffusers' AutoencoderKLMiniMaxH3Audio
// decode (dec_in_proj, then BigVGAN; waveform out, no mel stage and no
// vocoder): latents [B, latent_channels, L] -> mono waveforms
// [B, 1, hop · L] at sampling_rate, clamped to [-1, 1]. MiniMax-H3 sends
// stereo as a batch of 2. `raw` latents are de-normalised as its pipeline
// does: z * latents_std + latents_mean, per channel.
//
// Decoded densely in float32 whatever dtype the model is served in
// (DecodeDtype; diffusers' _keep_in_fp32_modules: BigVGAN degrades audibly
// in bf16).
// Audio is not served by the service yet (worker/model_repository.cc says
// so); `vaedecode decode` decodes it.

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/minimax_h3_audio/blocks.h"
#include "families/minimax_h3_audio/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::minimax_h3_audio {

// The decode-side parameters of AutoencoderKLMiniMaxH3Audio: dec_in_proj.*, decoder.*.
class MiniMaxH3AudioModuleImpl : public torch::nn::Module {
 public:
  explicit MiniMaxH3AudioModuleImpl(const MiniMaxH3AudioConfig& config);

  torch::nn::Conv1d dec_in_proj{nullptr};
  BigVGANDecoder decoder{nullptr};
};
TORCH_MODULE(MiniMaxH3AudioModule);

class MiniMaxH3AudioDecoder final : public ModuleDecoder<MiniMaxH3AudioModule> {
 public:
  using Config = MiniMaxH3AudioConfig;
  // A decoder with default-initialised weights (callers load or fill them).
  MiniMaxH3AudioDecoder(MiniMaxH3AudioConfig config, std::string config_json);

  // [B, latent_channels, L], L >= 1.
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& latent_shape) const override;
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z * latents_std + latents_mean
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;

  const MiniMaxH3AudioConfig& config() const { return config_; }

 private:
  MiniMaxH3AudioConfig config_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::minimax_h3_audio
