#pragma once

// Seam-free tile plans for decoding a latent that does not fit memory whole.
// Pure functions of (latent size, family geometry, memory budget): no
// decoder, no tensors, so every invariant is testable on its own.
//
// Rules (DESIGN.md §Tiling, from measurements on real weights):
//  - floor: tiles of at least 32 latents per side (or the whole side when it
//    is shorter), overlapping by at least 16 latents, spread evenly so the
//    last tile ends at the edge at full size;
//  - among layouts whose tile fits the budget (measured peak per latent of
//    tile area, plus headroom): fewest decoder calls, then the widest tile,
//    never decoding more latents per side than the family's stock diffusers
//    layout when such a layout exists;
//  - the whole latent when it fits; when even the floor tile does not, the
//    stock layout if its (smaller) tiles fit, else the smallest of the two
//    marked as not fitting: a plan predicted not to fit is refused, never
//    attempted.
//  - blend: a tile has zero weight within 4 latents of an edge it shares
//    with another tile and ramps to full weight over the next 8; weights are
//    normalised to sum to 1 at every pixel.

#include <cstdint>
#include <string>
#include <vector>

#include "tiling/memory_model.h"

namespace vaedecode::tiling {

inline constexpr int64_t kMinOverlap = 16;
inline constexpr int64_t kBlendDead = 4;  // latents of zero weight at a shared edge
inline constexpr int64_t kBlendRamp = 8;  // latents over which weight rises to 1

struct FamilyGeometry {
  int64_t spatial_factor = 8;  // pixels per latent
  int64_t stock_tile = 64;     // diffusers' tile_latent_min_size
  int64_t stock_stride = 48;   // tile_latent_min_size * (1 - tile_overlap_factor)
  // A tile's peak (tiling/memory_model.h), for the latent being planned:
  // its batch and frames scale every tile alike.
  MemoryModel memory = {{0, 0.17 * 1048576}};
  LatentExtent latent;
};

// One axis: tile starts and the common tile length.
struct AxisLayout {
  int64_t length = 0;           // latents along the axis
  int64_t tile = 0;             // tile length (== length when untiled)
  std::vector<int64_t> starts;  // ascending; starts.back() + tile == length
  int64_t decoded() const { return tile * static_cast<int64_t>(starts.size()); }
};

enum class PlanKind { kUntiled, kTiled, kStock };

struct TilePlan {
  PlanKind kind = PlanKind::kUntiled;
  AxisLayout rows;
  AxisLayout cols;
  int64_t peak_bytes = 0;  // estimated peak of one tile decode, with headroom
  // Predicted to fit the budget planned for: peak_bytes within it, or (the
  // smallest tiles only) the prediction without headroom.
  bool fits = true;
  std::string reason;
  int64_t calls() const { return static_cast<int64_t>(rows.starts.size() * cols.starts.size()); }
};

// Predicted decode peak of a tile of `rows` x `cols` latents, and the
// planner's estimate: the same with kHeadroom on what grows with the tile
// (RegionPeakBytes of geometry.memory for geometry.latent).
int64_t PredictPeakBytes(const FamilyGeometry& geometry, int64_t rows, int64_t cols);
int64_t EstimatePeakBytes(const FamilyGeometry& geometry, int64_t rows, int64_t cols);

// Evenly spread tiles of length `tile` over `length` with overlaps >= kMinOverlap.
AxisLayout SpreadTiles(int64_t length, int64_t tile);

// diffusers' stock loop along one axis: starts every stock_stride, tiles cut
// at the edge (so the last ones are shorter); returns latents decoded.
int64_t StockDecodedLatents(int64_t length, const FamilyGeometry& geometry);
AxisLayout StockLayout(int64_t length, const FamilyGeometry& geometry);

TilePlan PlanTiles(int64_t rows, int64_t cols, const FamilyGeometry& geometry, int64_t budget_bytes);

// Blend weight of every output pixel of every tile along one axis, already
// normalised across tiles: weights[k][p] for tile k and pixel p of that tile
// (tile * spatial_factor pixels). Sums to 1 at every pixel of the axis.
std::vector<std::vector<float>> AxisBlendWeights(const AxisLayout& layout, int64_t spatial_factor);

}  // namespace vaedecode::tiling
