#pragma once

// The HunyuanImage-2.1 family: diffusers' AutoencoderKLHunyuanImage decode
// path as `vae.decode(z)` runs it by default (tiling off): the decoder alone,
// no post-quant conv. `raw` latents are de-normalised as HunyuanImagePipeline
// does: z / scaling_factor.

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/hunyuanimage/blocks.h"
#include "families/hunyuanimage/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanimage {

// The decode-side parameters of AutoencoderKLHunyuanImage: decoder.*.
class HunyuanImageModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanImageModuleImpl(const HunyuanImageConfig& config);

  Decoder2D decoder{nullptr};
};
TORCH_MODULE(HunyuanImageModule);

class HunyuanImageDecoder final : public ModuleDecoder<HunyuanImageModule> {
 public:
  using Config = HunyuanImageConfig;
  // A decoder with default-initialised weights (callers load or fill them).
  HunyuanImageDecoder(HunyuanImageConfig config, std::string config_json);

  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z / scaling_factor
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;

  const HunyuanImageConfig& config() const { return config_; }

 private:
  HunyuanImageConfig config_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::hunyuanimage
