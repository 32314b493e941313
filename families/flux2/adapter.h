#pragma once

// How AutoencoderKLFlux2 shards by rows (exact mode): its decoder is
// AutoencoderKL's, so every layer shards as autoencoder_kl/adapter.h says
// (halo convs of radius <= 1, merged GroupNorm statistics, all-gathered K/V
// in the mid block; the only condition is >= 1 latent row per band).
//
// A `raw` latent is banded as the request holds it, [B, 4·C, h, w]: the
// BatchNorm de-normalisation is per channel and the 2x2 unpatchify turns each
// raw row into 2 VAE rows, so every band doubles and stays >= 1 row.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/flux2/config.h"

namespace vaedecode::families::flux2 {

// `latent_shape`: [B, C, h, w] (VAE space) or [B, 4·C, h, w] (raw).
absl::Status CheckExactSharding(const Flux2Config& config, const std::vector<int64_t>& latent_shape,
                                int world_size);

}  // namespace vaedecode::families::flux2
