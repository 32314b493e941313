#include "families/module_backed_decoder.h"

#include "absl/strings/str_cat.h"

#include <utility>

#include <torch/nn/module.h>

#include "families/row_bands.h"
#include "families/weight_loading.h"

namespace vaedecode::families {

ModuleBackedDecoder::ModuleBackedDecoder(ModelInfo info, int64_t latent_halo_rows)
    : info_(std::move(info)), latent_halo_rows_(latent_halo_rows) {}

void ModuleBackedDecoder::AdoptModule(torch::nn::Module& module) {
  module.eval();
  info_.parameter_count = CountParameters(module);
}

void ModuleBackedDecoder::ToDtype(at::ScalarType dtype) {
  ConvertWeights(dtype);
  dtype_ = dtype;
}

void ModuleBackedDecoder::ConvertWeights(at::ScalarType dtype) { parameters_module().to(dtype); }

void ModuleBackedDecoder::ToDevice(const c10::Device& device) {
  parameters_module().to(device);
  device_ = device;
}

absl::Status ModuleBackedDecoder::CheckExactSharding(const std::vector<int64_t>& latent_shape, int world_size) const {
  if (info_.is_audio) {
    return absl::FailedPreconditionError(absl::StrCat(
        info_.diffusers_class, " is an audio VAE: decoded densely on one process (its latents are small)"));
  }
  return CheckRowBands(latent_shape, world_size, info_.is_video ? 5 : 4, latent_halo_rows_);
}

}  // namespace vaedecode::families
