#include "families/encoder.h"

#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/weight_loading.h"

namespace vaedecode::families {

std::vector<parallel::ShardSpec> RowLevelSpecs(const std::vector<RowLevel>& levels, int rank, int world_size) {
  const std::vector<parallel::Band> latent = parallel::PartitionRows(levels.back().rows, world_size);
  std::vector<parallel::ShardSpec> specs;
  for (const RowLevel& level : levels) {
    parallel::ShardSpec spec;
    spec.rank = rank;
    spec.world_size = world_size;
    for (const parallel::Band& b : latent)
      spec.bands.push_back({b.begin * level.per_latent_row, b.end * level.per_latent_row});
    spec.bands.back().end = level.rows;
    specs.push_back(std::move(spec));
  }
  return specs;
}

absl::Status Encoder::ValidateImage(const at::Tensor& image) const {
  const EncoderInfo& m = info();
  const int64_t want_dims = m.is_video ? 5 : 4;
  const char* layout = m.is_video ? "[B, C, T, H, W]" : "[B, C, H, W]";
  if (image.dim() != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat("image must be ", want_dims, "-D ", layout, " for ",
                                                   m.diffusers_class, ", got shape [",
                                                   absl::StrJoin(image.sizes(), ", "), "]"));
  }
  if (image.size(1) != m.in_channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("image has ", image.size(1), " channels; ", m.diffusers_class, " encodes ", m.in_channels));
  }
  for (int64_t d = 0; d < image.dim(); ++d) {
    if (image.size(d) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("image has an empty dimension: shape [", absl::StrJoin(image.sizes(), ", "), "]"));
    }
  }
  if (!image.is_floating_point()) return absl::InvalidArgumentError("image must be a floating-point tensor");
  return absl::OkStatus();
}

absl::Status Encoder::CheckExactSharding(const std::vector<int64_t>& image_shape, int world_size) const {
  const std::vector<RowLevel> levels = RowLevels(image_shape[image_shape.size() - 2]);
  const int64_t latent_rows = levels.back().rows;
  if (latent_rows < world_size) {
    return absl::FailedPreconditionError(absl::StrCat("the latent has ", latent_rows, " rows, fewer than the ",
                                                      world_size, " ranks: some band would be empty"));
  }
  return absl::OkStatus();
}

void ModuleBackedEncoder::AdoptModule(torch::nn::Module& module) {
  module.eval();
  info_.parameter_count = CountParameters(module);
}

void ModuleBackedEncoder::ToDtype(at::ScalarType dtype) {
  ConvertWeights(dtype);
  dtype_ = dtype;
}

void ModuleBackedEncoder::ConvertWeights(at::ScalarType dtype) { parameters_module().to(dtype); }

void ModuleBackedEncoder::ToDevice(const c10::Device& device) {
  parameters_module().to(device);
  device_ = device;
}

}  // namespace vaedecode::families
