#pragma once

// How AutoencoderKL's layers shard by rows (exact mode):
//  - every conv is stride 1 with a centred 3x3 (halo 1) or 1x1 (halo 0)
//    kernel and zero padding: halo convolution;
//  - every GroupNorm: merged statistics, one collective;
//  - the mid-block attention: local Q, all-gathered K/V;
//  - SiLU, residual adds, Linear q/k/v/out: local;
//  - nearest 2x upsampling: local, bands double.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution (bands only grow from there).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/autoencoder_kl/config.h"

namespace vaedecode::families::autoencoder_kl {

// The largest row halo of any layer at the latent resolution.
inline constexpr int64_t kLatentHalo = 1;

absl::Status CheckExactSharding(const AutoencoderKLConfig& config,
                                const std::vector<int64_t>& latent_shape, int world_size);

}  // namespace vaedecode::families::autoencoder_kl
