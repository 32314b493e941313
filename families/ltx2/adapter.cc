#include "families/ltx2/adapter.h"

#include "absl/strings/str_cat.h"

namespace vaedecode::families::ltx2 {

absl::Status CheckExactSharding(const LTX2Config&, const std::vector<int64_t>& latent_shape, int world_size) {
  if (world_size < 2) return absl::FailedPreconditionError("world size 1: nothing to shard");
  if (latent_shape.size() != 5) return absl::InvalidArgumentError("latent must be [B, C, T, H, W]");
  const int64_t rows = latent_shape[3];
  const int64_t thinnest = rows / world_size;
  if (thinnest < kLatentHalo) {
    return absl::FailedPreconditionError(absl::StrCat("latent height ", rows, " over ", world_size,
                                                      " ranks leaves a band of ", thinnest,
                                                      " rows, thinner than the conv halo (", kLatentHalo, " row)"));
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::families::ltx2
