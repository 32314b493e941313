#include "tiling/tiled_decode.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace vaedecode::tiling {

at::Tensor DecodeTiles(families::Decoder& decoder, const at::Tensor& z, const TilePlan& plan,
                       families::LayerOps& ops) {
  const int64_t h_dim = z.dim() - 2, w_dim = z.dim() - 1;
  const int64_t f = decoder.info().spatial_factor;
  if (plan.kind == PlanKind::kUntiled) return decoder.Decode(z, ops);

  const std::vector<std::vector<float>> row_w = AxisBlendWeights(plan.rows, f);
  const std::vector<std::vector<float>> col_w = AxisBlendWeights(plan.cols, f);
  at::Tensor out;
  for (size_t i = 0; i < plan.rows.starts.size(); ++i) {
    for (size_t j = 0; j < plan.cols.starts.size(); ++j) {
      const at::Tensor tile_z = z.narrow(h_dim, plan.rows.starts[i], plan.rows.tile)
                                    .narrow(w_dim, plan.cols.starts[j], plan.cols.tile)
                                    .contiguous();
      const at::Tensor tile = decoder.Decode(tile_z, ops).to(at::kFloat);  // [B, C, (T,) th*f, tw*f]
      if (!out.defined()) {
        std::vector<int64_t> shape = tile.sizes().vec();
        shape[h_dim] = plan.rows.length * f;
        shape[w_dim] = plan.cols.length * f;
        out = at::zeros(shape, tile.options());
      }
      const at::Tensor wy = at::tensor(row_w[i]).view({-1, 1});
      const at::Tensor wx = at::tensor(col_w[j]).view({1, -1});
      at::Tensor dest = out.narrow(h_dim, plan.rows.starts[i] * f, plan.rows.tile * f)
                            .narrow(w_dim, plan.cols.starts[j] * f, plan.cols.tile * f);
      dest.add_(tile * (wy * wx));  // weights broadcast over batch, channels, frames
    }
  }
  return out.to(decoder.dtype());
}

namespace {

TilePlan FloorPlan(const TilePlan& plan) {
  TilePlan floor = plan;
  floor.kind = PlanKind::kTiled;
  floor.rows = SpreadTiles(plan.rows.length, kFloorTile);
  floor.cols = SpreadTiles(plan.cols.length, kFloorTile);
  floor.reason = "retry at the 32-latent floor tile after running out of memory";
  return floor;
}

TilePlan StockPlan(const TilePlan& plan, const FamilyGeometry& g) {
  TilePlan stock = plan;
  stock.kind = PlanKind::kStock;
  stock.rows = StockLayout(plan.rows.length, g);
  stock.cols = StockLayout(plan.cols.length, g);
  stock.reason = "retry with stock tiles after running out of memory";
  return stock;
}

}  // namespace

absl::StatusOr<TiledResult> RunOomLadder(const TilePlan& plan, const FamilyGeometry& geometry,
                                         const TileAttempt& attempt_fn) {
  std::vector<TilePlan> ladder = {plan};
  if (plan.kind != PlanKind::kStock) {
    ladder.push_back(FloorPlan(plan));
    ladder.push_back(StockPlan(plan, geometry));
  }
  absl::Status last;
  for (size_t attempt = 0; attempt < ladder.size(); ++attempt) {
    absl::StatusOr<at::Tensor> sample = attempt_fn(ladder[attempt]);
    if (sample.ok()) return TiledResult{*sample, ladder[attempt], static_cast<int>(attempt)};
    last = sample.status();
    if (last.code() != absl::StatusCode::kResourceExhausted) return last;
    spdlog::warn("tiled decode ran out of memory with {}x{} tiles ({} calls); {}", ladder[attempt].rows.tile,
                 ladder[attempt].cols.tile, ladder[attempt].calls(),
                 attempt + 1 < ladder.size() ? ladder[attempt + 1].reason : "no smaller tiles left");
  }
  return last;
}

}  // namespace vaedecode::tiling
