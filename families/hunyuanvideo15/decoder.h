#pragma once

// The HunyuanVideo 1.5 family: diffusers' AutoencoderKLHunyuanVideo15 decode
// path as `vae.decode(z)` runs it by default (tiling off, no temporal
// tiling at any length): the decoder alone on the whole clip, no post-quant
// conv. diffusers cannot decode a batch > 1 at once (its attention mask
// broadcasts to (B, B, L, L)); with enable_slicing it decodes one entry at a
// time, which is what a batch here computes (entries never mix). `raw`
// latents are de-normalised as HunyuanVideo15Pipeline does: z / scaling_factor.
// It streams (sessions): Decode is one chunk of a fresh stream (a latent
// frame at a time on whole tensors, DecodeStream), so a clip decoded chunk
// by chunk through a StreamState gives the whole decode's frames.

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "families/hunyuanvideo15/blocks.h"
#include "families/hunyuanvideo15/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanvideo15 {

// The decode-side parameters of AutoencoderKLHunyuanVideo15: decoder.*.
class HunyuanVideo15ModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanVideo15ModuleImpl(const HunyuanVideo15Config& config);

  Decoder3D decoder{nullptr};
};
TORCH_MODULE(HunyuanVideo15Module);

class HunyuanVideo15Decoder final : public ModuleDecoder<HunyuanVideo15Module> {
 public:
  using Config = HunyuanVideo15Config;
  // A decoder with default-initialised weights (callers load or fill them).
  HunyuanVideo15Decoder(HunyuanVideo15Config config, std::string config_json);

  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z / scaling_factor
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  // Causal in time: the convs pad with the frames before, the attention is
  // frame-causal and the norms are per position (StreamState).
  absl::Status CheckStreaming() const override { return absl::OkStatus(); }
  using Decoder::OpenStream;
  std::unique_ptr<DecodeStream> OpenStream(const DecodeConditioning& conditioning) override;

  const HunyuanVideo15Config& config() const { return config_; }

 private:
  HunyuanVideo15Config config_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::hunyuanvideo15
