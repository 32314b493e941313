#pragma once

// What every family's Decoder shares, written once: its ModelInfo, the
// LibTorch module that holds the decode-side parameters under diffusers'
// state-dict names, its dtype and device, the row-band precondition of exact
// sharding, and the strict loader (config, module, weights). A family adds
// its config, its module and what is its own (ToVaeSpace, Decode).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/model_files.h"
#include "families/registry.h"
#include "families/row_bands.h"
#include "families/weight_loading.h"

namespace vaedecode::families {

// ModuleHolder: a TORCH_MODULE holder (e.g. HunyuanImageModule).
template <typename ModuleHolder>
class ModuleDecoder : public Decoder {
 public:
  const ModelInfo& info() const final { return info_; }
  void ToDtype(at::ScalarType dtype) final {
    ConvertWeights(dtype);
    dtype_ = dtype;
  }
  at::ScalarType dtype() const final { return dtype_; }
  void ToDevice(const c10::Device& device) final {
    module_->to(device);
    device_ = device;
  }
  c10::Device device() const final { return device_; }

  // Bands of at least `latent_halo_rows` rows (every layer after the latent
  // resolution only grows them); families with other limits override.
  absl::Status CheckExactSharding(const std::vector<int64_t>& latent_shape, int world_size) const override {
    return CheckRowBands(latent_shape, world_size, info_.is_video ? 5 : 4, latent_halo_rows_);
  }

  ModuleHolder& module() { return module_; }

 protected:
  // `info` without parameter_count (counted here); the module in eval mode.
  ModuleDecoder(ModuleHolder module, ModelInfo info, int64_t latent_halo_rows)
      : module_(std::move(module)), info_(std::move(info)), latent_halo_rows_(latent_halo_rows) {
    module_->eval();
    info_.parameter_count = CountParameters(*module_);
  }

  // Converts what computes in the decode dtype: the whole module, unless a
  // family keeps pipeline-side statistics (FLUX.2's BatchNorm, LTX-2's
  // latents_mean/std) in float32.
  virtual void ConvertWeights(at::ScalarType dtype) { module_->to(dtype); }

  ModuleHolder module_;
  ModelInfo info_;

 private:
  int64_t latent_halo_rows_;
  at::ScalarType dtype_ = at::kFloat;
  c10::Device device_ = c10::Device(c10::kCPU);
};

// The strict loader of a ModuleDecoder family: DecoderT::Config::FromJson on
// the folder's config, DecoderT(config, config text), then every module
// parameter from the checkpoint (FillWeights), keys matched by `ignore`
// skipped (the encoder side decode() never touches).
template <typename DecoderT>
absl::StatusOr<std::unique_ptr<Decoder>> LoadModuleDecoder(const ModelFiles& files, const LoadOptions& options,
                                                           const IgnoreRules& ignore) {
  absl::StatusOr<typename DecoderT::Config> config = DecoderT::Config::FromJson(files.config(), files.config_path());
  if (!config.ok()) return config.status();
  auto decoder = std::make_unique<DecoderT>(*std::move(config), files.config().dump(2));
  if (absl::Status loaded = FillWeights(*decoder->module(), files, ignore, options); !loaded.ok()) return loaded;
  return decoder;
}

}  // namespace vaedecode::families
