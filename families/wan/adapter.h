#pragma once

// How the Wan-lineage decoders (Wan 2.1, Wan 2.2, Qwen-Image) shard by rows
// (exact mode), with height as the sharded axis of every activation:
//  - every spatial conv (the 3x3x3 causal convs, the upsamplers' 3x3 convs)
//    is stride 1 with a centred kernel and zero padding: halo convolution,
//    halo 1; the (3,1,1) time_conv and the 1x1(x1) convs need no halo;
//  - causal temporal padding and the feature cache are local: every rank
//    holds the whole temporal sequence of its band and runs diffusers' chunk
//    protocol unchanged (one latent frame at a time);
//  - the mid-block attention, per frame: local Q, all-gathered K/V;
//  - RMS norms (over channels), SiLU, residual adds: local;
//  - nearest 2x upsampling, DupUp3D and the final unpatchify: local, each
//    input row becomes 2 (or P) output rows, so bands scale uniformly.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution (bands only grow from there).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/wan/config.h"

namespace vaedecode::families::wan {

// The largest row halo of any layer at the latent resolution.
inline constexpr int64_t kLatentHalo = 1;

// OK when a [B, C, T, H, W] latent can be decoded exactly over `world_size`
// row bands; FAILED_PRECONDITION with the reason otherwise.
absl::Status CheckExactSharding(const WanConfig& config, const std::vector<int64_t>& latent_shape,
                                int world_size);

}  // namespace vaedecode::families::wan
