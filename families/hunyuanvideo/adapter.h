#pragma once

// How AutoencoderKLHunyuanVideo's decoder shards by rows (exact mode), with
// height as the sharded axis of every activation:
//  - every causal conv is stride 1 with a centred 3x3x3 (halo 1) or 1x1x1
//    (no halo) kernel, replicate padding in space applied by the conv (only
//    at the global top and bottom; interior edges read neighbours' rows);
//  - temporal padding (the first frame repeated) and the temporal tiles of
//    long latents are local: every rank holds the whole temporal sequence of
//    its band and decodes the same tiles;
//  - every GroupNorm: merged statistics, one collective;
//  - the mid-block attention over T·H·W tokens with the frame-causal mask:
//    local Q, every frame's K/V band in one all-gather (see blocks.h for why
//    it is sharded rather than gathered around the mid block);
//  - SiLU, residual adds, Linear q/k/v/out, nearest upsampling (the first
//    frame in space only), the temporal blend of tiles: local; upsampling
//    doubles every band.
// So the only condition is that every band keeps >= 1 row at the latent
// resolution.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "families/hunyuanvideo/config.h"

namespace vaedecode::families::hunyuanvideo {

// The largest row halo of any layer at the latent resolution.
inline constexpr int64_t kLatentHalo = 1;

// OK when a [B, C, T, H, W] latent can be decoded exactly over `world_size`
// row bands; FAILED_PRECONDITION with the reason otherwise.
absl::Status CheckExactSharding(const HunyuanVideoConfig& config, const std::vector<int64_t>& latent_shape,
                                int world_size);

}  // namespace vaedecode::families::hunyuanvideo
