#pragma once

// What every family's Decoder shares, written once, without torch::nn in
// the header (so a family can keep its modules out of its own header, as
// the Wan lineage does): its ModelInfo, dtype and device, the row-band
// precondition of exact sharding, and the LibTorch module that holds the
// decode-side parameters under diffusers' state-dict names.
// families/module_decoder.h adds the typed module and the strict loader.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "families/decoder.h"

namespace torch::nn {
class Module;
}

namespace vaedecode::families {

class ModuleBackedDecoder : public Decoder {
 public:
  const ModelInfo& info() const final { return info_; }
  void ToDtype(at::ScalarType dtype) final;
  at::ScalarType dtype() const final { return dtype_; }
  void ToDevice(const c10::Device& device) final;
  c10::Device device() const final { return device_; }

  // Bands of at least `latent_halo_rows` rows (every layer after the latent
  // resolution only grows them); families with other limits override.
  absl::Status CheckExactSharding(const std::vector<int64_t>& latent_shape, int world_size) const override;

  // The decode side of the diffusers model (decoder.*, post_quant_conv.*, ...).
  virtual torch::nn::Module& parameters_module() = 0;

 protected:
  // `info` without parameter_count (AdoptModule counts it).
  ModuleBackedDecoder(ModelInfo info, int64_t latent_halo_rows);

  // For the derived constructor, once its module exists: eval mode and the
  // parameter count.
  void AdoptModule(torch::nn::Module& module);

  // Converts what computes in the decode dtype: the whole module, unless a
  // family keeps some parameters in float32 (FLUX.2's BatchNorm, LTX-2's
  // latents_mean/std, MiniMax-H3's norms).
  virtual void ConvertWeights(at::ScalarType dtype);

  ModelInfo info_;

 private:
  int64_t latent_halo_rows_;
  at::ScalarType dtype_ = at::kFloat;
  c10::Device device_ = c10::Device(c10::kCPU);
};

}  // namespace vaedecode::families
