#pragma once

// The Hunyuan Image 3 family: HunyuanImage-3.0's AutoencoderKLConv3D (release
// code; diffusers has no copy) decoding images as its pipeline does. The
// pipeline's latents are [B, C, h, w]; it unsqueezes a frame axis,
// `vae.decode` turns that one latent frame into ffactor_temporal frames and
// keeps the last, and the pipeline squeezes it: so this family takes NCHW
// latents and returns NCHW images, that last frame. `raw` latents are
// de-normalised as the pipeline does: z / scaling_factor (+ shift_factor).

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/hunyuanimage3/blocks.h"
#include "families/hunyuanimage3/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanimage3 {

// The decode-side parameters of AutoencoderKLConv3D: decoder.*.
class HunyuanImage3ModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanImage3ModuleImpl(const HunyuanImage3Config& config);

  Decoder3D decoder{nullptr};
};
TORCH_MODULE(HunyuanImage3Module);

class HunyuanImage3Decoder final : public ModuleDecoder<HunyuanImage3Module> {
 public:
  using Config = HunyuanImage3Config;
  // A decoder with default-initialised weights (callers load or fill them).
  HunyuanImage3Decoder(HunyuanImage3Config config, std::string config_json);

  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z / scaling_factor (+ shift_factor)
  // [B, C, h, w] -> [B, out, h·s, w·s]: the last of the decoded frames.
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;

  const HunyuanImage3Config& config() const { return config_; }

 private:
  HunyuanImage3Config config_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::hunyuanimage3
