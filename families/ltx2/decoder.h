#pragma once

// The LTX-2 family: diffusers' AutoencoderKLLTX2Video decode path
// (LTX2VideoDecoder3d on the whole latent: no post-quant conv, no tiling),
// and LTX2Pipeline's de-normalisation of `raw` latents with the model's
// latents_mean / latents_std buffers.
//
// Timestep-conditioned decoders are decoded at the request's timestep
// (DecodeConditioning; 0.0 by default, LTX2Pipeline's default
// decode_timestep). The pipeline's latent noising is the caller's (the
// worker's leader mixes it in before the decode).
// Noise-injecting decoders are refused at load (see LTX2Config::FromJson).

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/ltx2/blocks.h"
#include "families/ltx2/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::ltx2 {

// The decode-side state of AutoencoderKLLTX2Video, named as in its state dict:
// decoder.*, latents_mean, latents_std.
class AutoencoderKLLTX2VideoModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLLTX2VideoModuleImpl(const LTX2Config& config);

  LTX2VideoDecoder3d decoder{nullptr};
  at::Tensor latents_mean;  // [latent_channels]
  at::Tensor latents_std;   // [latent_channels]
};
TORCH_MODULE(AutoencoderKLLTX2VideoModule);

class LTX2Decoder final : public ModuleDecoder<AutoencoderKLLTX2VideoModule> {
 public:
  using Config = LTX2Config;
  // A decoder with default-initialised weights (callers load or fill them).
  LTX2Decoder(LTX2Config config, std::string config_json);

  // Also: reflect padding needs latent width >= 2 (as in diffusers).
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  // LTX2Pipeline._denormalize_latents: z * latents_std / scaling_factor + latents_mean, per channel.
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops, const DecodeConditioning& conditioning) override;
  // A causal decoder (config decoder_causal) streams, and decodes a clip as
  // one chunk of a stream; the released non-causal ones do not.
  absl::Status CheckStreaming() const override;
  using Decoder::OpenStream;
  std::unique_ptr<DecodeStream> OpenStream(const DecodeConditioning& conditioning) override;

  const LTX2Config& config() const { return config_; }

 private:
  // The decoder's timestep input for z's batch (undefined unless conditioned).
  at::Tensor Timestep(const at::Tensor& z, const DecodeConditioning& conditioning) const;

  // The decoder's weights; latents_mean / latents_std stay fp32.
  void ConvertWeights(at::ScalarType dtype) override;

  LTX2Config config_;
};

// Loads an AutoencoderKLLTX2Video from diffusers files (encoder.* ignored by
// name; decoder-only files are fine).
absl::StatusOr<std::unique_ptr<Decoder>> LoadLTX2(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::ltx2
