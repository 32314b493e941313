#pragma once

// How AutoencoderKLFlux2 shards by rows (exact mode): its decoder is
// AutoencoderKL's, so every layer shards as autoencoder_kl/adapter.h says
// (halo convs of radius <= 1, merged GroupNorm statistics, all-gathered K/V
// in the mid block; the only condition is >= 1 latent row per band).
//
// A `raw` latent is unpacked (BatchNorm de-normalisation, 2x2 unpatchify)
// once, on the leader, before it is sharded (worker/decode_plan.h): the
// bands are cut from the VAE-space latent, 2h rows for h raw rows.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/flux2/config.h"

namespace vaedecode::families::flux2 {

// `latent_shape`: [B, C, H, W], VAE space.
absl::Status CheckExactSharding(const Flux2Config& config, const std::vector<int64_t>& latent_shape,
                                int world_size);

}  // namespace vaedecode::families::flux2
