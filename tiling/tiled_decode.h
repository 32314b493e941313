#pragma once

// Executes a TilePlan: decodes every tile of the latent with the family's
// own decoder and blends the tiles into the output with the plan's weights
// (vectorised over each tile: one multiply-add of the tile by the outer
// product of its row and column weights).
//
// Works for image (NCHW) and video (NCTHW) latents: tiles are spatial only.
// DecodeTiles may throw c10::Error / StatusError like any decode: the caller
// runs it inside families::CatchExceptions.

#include <vector>

#include <ATen/core/Tensor.h>

#include "families/decoder.h"
#include "families/layer_ops.h"
#include "tiling/planner.h"

namespace vaedecode::tiling {

// The latent of tile (i, j) of `plan` (contiguous).
at::Tensor TileLatent(const at::Tensor& z, const TilePlan& plan, size_t i, size_t j);

// Accumulates decoded tiles into the output, each times the outer product of
// its normalised row and column weights; tiles may arrive in any order.
class TileBlender {
 public:
  TileBlender(const TilePlan& plan, int64_t spatial_factor);
  // `tile`: [B, C, (T,) tile_rows*f, tile_cols*f] of tile (i, j).
  void Add(size_t i, size_t j, const at::Tensor& tile);
  at::Tensor Finish(at::ScalarType dtype) const;
  // The float32 accumulation so far (undefined before the first tile).
  const at::Tensor& blended() const { return out_; }

 private:
  const TilePlan& plan_;
  const int64_t f_;
  std::vector<std::vector<float>> row_w_;
  std::vector<std::vector<float>> col_w_;
  // The same on the tiles' device ([rows, 1] and [1, cols]), made at the first tile.
  std::vector<at::Tensor> row_w_on_device_;
  std::vector<at::Tensor> col_w_on_device_;
  at::Tensor out_;
};

// `z` is in VAE space and the decoder's dtype.
at::Tensor DecodeTiles(families::Decoder& decoder, const at::Tensor& z, const TilePlan& plan, families::LayerOps& ops);

// The plans of the out-of-memory ladder: `plan`, then floor tiles, then the
// stock layout, keeping only rungs whose tiles are smaller than every rung
// before them (so a stock plan of large tiles is followed by floor tiles).
// The group's tiled decode (worker/tiled_group_decode.h) walks it on an
// out-of-memory.
std::vector<TilePlan> OomLadder(const TilePlan& plan, const FamilyGeometry& geometry);

}  // namespace vaedecode::tiling
