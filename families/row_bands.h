#pragma once

// The exact-sharding precondition every family shares: a latent
// split into row bands (the first ranks take the remainder,
// parallel/band_partition.h) must leave every band at least the decoder's
// largest latent-resolution row halo thick (bands only grow from there).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace vaedecode::families {

// OK when a latent of `latent_shape`, of rank `rank` (4: [B, C, H, W]; 5:
// [B, C, T, H, W]), can be split into `world_size` row bands of at least
// `halo_rows` rows; FAILED_PRECONDITION with the reason otherwise
// (INVALID_ARGUMENT for another rank).
absl::Status CheckRowBands(const std::vector<int64_t>& latent_shape, int world_size, size_t rank, int64_t halo_rows);

}  // namespace vaedecode::families
