#include "families/row_bands.h"

#include "absl/strings/str_cat.h"

namespace vaedecode::families {

absl::Status CheckRowBands(const std::vector<int64_t>& latent_shape, int world_size, size_t rank, int64_t halo_rows) {
  if (world_size < 2) return absl::FailedPreconditionError("world size 1: nothing to shard");
  if (latent_shape.size() != rank) {
    return absl::InvalidArgumentError(rank == 4 ? "latent must be [B, C, H, W]" : "latent must be [B, C, T, H, W]");
  }
  const int64_t rows = latent_shape[rank - 2];
  const int64_t thinnest = rows / world_size;
  if (thinnest < halo_rows) {
    return absl::FailedPreconditionError(absl::StrCat("latent height ", rows, " over ", world_size,
                                                      " ranks leaves a band of ", thinnest,
                                                      " rows, thinner than the conv halo (", halo_rows, " row)"));
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::families
