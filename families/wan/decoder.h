#pragma once

// The Wan family: diffusers' AutoencoderKLWan decode path (post_quant_conv,
// then WanDecoder3d one latent frame at a time with a causal feature cache,
// the Wan 2.2 unpatchify, the clamp to [-1, 1]) for Wan 2.1 and Wan 2.2
// configs. Qwen-Image (families/qwenimage) and Qwen-Image-2.1
// (families/qwenimage21, image-only 2-D convs) build the same decoder from
// their own configs and name the block types they accept.
//
// This header is free of torch::nn so that families built on Wan stay cheap
// to compile; the modules are in families/wan/blocks.h.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/module_backed_decoder.h"
#include "families/registry.h"
#include "families/wan/config.h"

namespace vaedecode::families::wan {

class AutoencoderKLWanImpl;

// The checkpoints of the Wan lineage (Wan, Qwen-Image), which look alike:
// RMS norms with `gamma`, 5-D convs without wrappers.
KeySignature WanLineageKeys();

// Its module stays behind a pointer (blocks.h) so that this header keeps
// torch::nn out of every family built on Wan.
class WanDecoder final : public ModuleBackedDecoder {
 public:
  // A decoder with default-initialised weights (callers load or fill them).
  // INVALID_ARGUMENT when `config` needs an up-block type `family` does not accept.
  static absl::StatusOr<std::unique_ptr<WanDecoder>> Create(const WanFamily& family, WanConfig config,
                                                            std::string config_json);
  ~WanDecoder() override;

  // The pipelines' de-normalisation: z / (1 / latents_std) + latents_mean, per channel.
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;
  // The whole clip through a fresh stream: the module holds no decode state.
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  // Also: one frame for an image-only model (Qwen-Image-2.1).
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  // Causal in time: every Wan-lineage video config streams (its feature
  // cache is the stream's state); the image-only one refuses.
  absl::Status CheckStreaming() const override;
  using Decoder::OpenStream;
  std::unique_ptr<DecodeStream> OpenStream(const DecodeConditioning& conditioning) override;

  const WanConfig& config() const { return config_; }
  // The decode side of the diffusers model, named as its state dict
  // (decoder.*, post_quant_conv.*).
  torch::nn::Module& parameters_module() override;
  torch::nn::Module& module() { return parameters_module(); }

 private:
  WanDecoder(const WanFamily& family, WanConfig config, std::string config_json);
  // A stream for any config: Decode runs the whole clip through one.
  std::unique_ptr<DecodeStream> NewStream();

  WanConfig config_;
  bool multiplies_by_std_;
  std::shared_ptr<AutoencoderKLWanImpl> module_;
};

// Builds a `family` decoder for `config` and loads it strictly from `files`
// (encoder.* and quant_conv.* ignored by name).
absl::StatusOr<std::unique_ptr<Decoder>> LoadWanFamily(const WanFamily& family, const WanConfig& config,
                                                       const ModelFiles& files, const LoadOptions& options);

// Loads an AutoencoderKLWan from diffusers files.
absl::StatusOr<std::unique_ptr<Decoder>> LoadWan(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::wan
