#include "families/encoder.h"

#include <algorithm>

#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/input_checks.h"
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

std::vector<RowLevel> DownsampledRowLevels(int64_t rows, int64_t downsamplers) {
  std::vector<RowLevel> levels;
  for (int64_t i = 0; i <= downsamplers; ++i) {
    levels.push_back({rows, int64_t{1} << (downsamplers - i)});
    rows = (rows - 2) / 2 + 1;  // Downsample2D: (rows + 1 - 3) / 2 + 1, rows >= 2
  }
  return levels;
}

std::vector<RowLevel> RowLevelsOfRows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ratios) {
  std::vector<RowLevel> levels(rows.size());
  int64_t per_latent_row = 1;
  for (size_t i = rows.size(); i-- > 0;) {
    levels[i] = {rows[i], per_latent_row};
    if (i > 0) per_latent_row *= ratios[i - 1];
  }
  return levels;
}

std::vector<RowLevel> HalvedRowLevels(int64_t rows, int64_t downsamplers) {
  std::vector<RowLevel> levels;
  for (int64_t i = 0; i <= downsamplers; ++i) levels.push_back({rows >> i, int64_t{1} << (downsamplers - i)});
  return levels;
}

absl::Status Encoder::ValidateImage(const at::Tensor& image) const {
  const EncoderInfo& m = info();
  return CheckInputTensor(image, {"image", m.diffusers_class, "encodes", m.in_channels, m.is_video});
}

absl::Status Encoder::CheckExactSharding(const std::vector<int64_t>& image_shape, int world_size) const {
  if (info().is_audio) {
    return absl::FailedPreconditionError(absl::StrCat(
        info().diffusers_class, " is an audio VAE: encoded densely on one process (its inputs are small)"));
  }
  const std::vector<RowLevel> levels = RowLevels(image_shape[image_shape.size() - 2]);
  const int64_t latent_rows = levels.back().rows;
  if (latent_rows < world_size) {
    return absl::FailedPreconditionError(absl::StrCat("the latent has ", latent_rows, " rows, fewer than the ",
                                                      world_size, " ranks: some band would be empty"));
  }
  // The sharded ops tell the levels apart by a band's rows: a band with as
  // many rows at two levels (a last band of one row where downsamplers round
  // up) cannot be followed.
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<int64_t> seen;
    for (const parallel::ShardSpec& spec : RowLevelSpecs(levels, rank, world_size)) {
      const int64_t rows = spec.local_rows();
      if (std::find(seen.begin(), seen.end(), rows) != seen.end()) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", rank, "'s band has ", rows,
                                                          " rows at two resolutions of the encoder: "
                                                          "encoded densely (another size or group shards)"));
      }
      seen.push_back(rows);
    }
  }
  return absl::OkStatus();
}

void ModuleBackedEncoder::AdoptModule(torch::nn::Module& module) {
  module.eval();
  info_.parameter_count = CountParameters(module);
}

void ModuleBackedEncoder::ToDtype(at::ScalarType dtype) {
  const at::ScalarType compute = info_.computes_in_float32 ? at::kFloat : dtype;
  ConvertWeights(compute);
  dtype_ = compute;
}

void ModuleBackedEncoder::ConvertWeights(at::ScalarType dtype) { parameters_module().to(dtype); }

void ModuleBackedEncoder::ToDevice(const c10::Device& device) {
  parameters_module().to(device);
  device_ = device;
}

}  // namespace vaedecode::families
