#pragma once

// A family Decoder over a typed LibTorch module (ModuleBackedDecoder's
// shared parts plus the module under diffusers' state-dict names) and the
// strict loader (config, module, weights). A family adds its config, its
// module and what is its own (ToVaeSpace, Decode).

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
#include "families/module_backed_decoder.h"
#include "families/registry.h"
#include "families/weight_loading.h"
#include "rpc/status_macros.h"

namespace vaedecode::families {

// ModuleHolder: a TORCH_MODULE holder (e.g. HunyuanImageModule).
template <typename ModuleHolder>
class ModuleDecoder : public ModuleBackedDecoder {
 public:
  ModuleHolder& module() { return module_; }
  torch::nn::Module& parameters_module() final { return *module_; }

 protected:
  // `info` without parameter_count (counted here); the module in eval mode.
  ModuleDecoder(ModuleHolder module, ModelInfo info, int64_t latent_halo_rows)
      : ModuleBackedDecoder(std::move(info), latent_halo_rows), module_(std::move(module)) {
    AdoptModule(*module_);
  }

  ModuleHolder module_;
};

// The strict loader of a ModuleDecoder family: DecoderT::Config::FromJson on
// the folder's config, DecoderT(config, config text), then every module
// parameter from the checkpoint (FillWeights), keys matched by `ignore`
// skipped (the encoder side decode() never touches).
template <typename DecoderT>
absl::StatusOr<std::unique_ptr<Decoder>> LoadModuleDecoder(const ModelFiles& files, const LoadOptions& options,
                                                           const IgnoreRules& ignore) {
  ASSIGN_OR_RETURN(typename DecoderT::Config config, DecoderT::Config::FromJson(files.config(), files.config_path()));
  auto decoder = std::make_unique<DecoderT>(std::move(config), files.config().dump(2));
  RETURN_IF_ERROR(FillWeights(*decoder->module(), files, ignore, options));
  return decoder;
}

}  // namespace vaedecode::families
