#pragma once

// How AutoencoderKLLTX2Video's decoder shards by rows (exact mode), with
// height as the sharded axis of every activation:
//  - every 3x3x3 conv is stride 1 with a centred kernel and its spatial
//    padding (zeros, reflect or replicate) inside the conv: halo convolution
//    of radius 1, the layer's padding applied only at the global top and
//    bottom, neighbours' real rows at interior edges. Reflect at a global edge
//    reads rows 1..pad, which the edge band plus its one-sided halo always
//    holds (band + halo >= pad + 1 whenever band >= halo), so reflect needs no
//    more than zeros does; the dense decode itself needs height >= 2;
//  - 1x1x1 conv_shortcuts: no halo;
//  - temporal padding (replicated first/last frames) is local: every rank
//    holds the whole temporal sequence of its band;
//  - PerChannelRMSNorm, the LayerNorm of a widening resnet, SiLU, the
//    timestep modulation: per pixel, local;
//  - the depth-to-space upsamplers and the final unpatchify: local, each row
//    becomes stride_h (or patch_size) rows, so bands scale uniformly;
//  - no GroupNorm and no attention: the decode's only collectives are the
//    halo exchanges and the final row gather.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/ltx2/config.h"

namespace vaedecode::families::ltx2 {

// The largest row halo of any layer at the latent resolution.
inline constexpr int64_t kLatentHalo = 1;

// OK when a [B, C, T, H, W] latent can be decoded exactly over `world_size`
// row bands; FAILED_PRECONDITION with the reason otherwise.
absl::Status CheckExactSharding(const LTX2Config& config, const std::vector<int64_t>& latent_shape, int world_size);

}  // namespace vaedecode::families::ltx2
