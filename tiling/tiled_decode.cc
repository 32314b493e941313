#include "tiling/tiled_decode.h"

#include <ATen/ATen.h>

namespace vaedecode::tiling {

at::Tensor TileLatent(const at::Tensor& z, const TilePlan& plan, size_t i, size_t j) {
  return z.narrow(z.dim() - 2, plan.rows.starts[i], plan.rows.tile)
      .narrow(z.dim() - 1, plan.cols.starts[j], plan.cols.tile)
      .contiguous();
}

TileBlender::TileBlender(const TilePlan& plan, int64_t spatial_factor)
    : plan_(plan),
      f_(spatial_factor),
      row_w_(AxisBlendWeights(plan.rows, spatial_factor)),
      col_w_(AxisBlendWeights(plan.cols, spatial_factor)) {}

void TileBlender::Add(size_t i, size_t j, const at::Tensor& tile_in) {
  const at::Tensor tile = tile_in.to(at::kFloat);
  const int64_t h_dim = tile.dim() - 2, w_dim = tile.dim() - 1;
  if (!out_.defined()) {
    std::vector<int64_t> shape = tile.sizes().vec();
    shape[h_dim] = plan_.rows.length * f_;
    shape[w_dim] = plan_.cols.length * f_;
    out_ = at::zeros(shape, tile.options());
  }
  if (row_w_on_device_.empty() || row_w_on_device_[0].device() != tile.device()) {
    // Once per plan: on a GPU each would be a host-to-device copy per tile.
    row_w_on_device_.clear();
    col_w_on_device_.clear();
    for (const std::vector<float>& w : row_w_)
      row_w_on_device_.push_back(at::tensor(w).to(tile.device()).view({-1, 1}));
    for (const std::vector<float>& w : col_w_)
      col_w_on_device_.push_back(at::tensor(w).to(tile.device()).view({1, -1}));
  }
  const at::Tensor& wy = row_w_on_device_[i];
  const at::Tensor& wx = col_w_on_device_[j];
  at::Tensor dest = out_.narrow(h_dim, plan_.rows.starts[i] * f_, plan_.rows.tile * f_)
                        .narrow(w_dim, plan_.cols.starts[j] * f_, plan_.cols.tile * f_);
  dest.add_(tile * (wy * wx));  // weights broadcast over batch, channels, frames
}

at::Tensor TileBlender::Finish(at::ScalarType dtype) const { return out_.to(dtype); }

at::Tensor DecodeTiles(families::Decoder& decoder, const at::Tensor& z, const TilePlan& plan, families::LayerOps& ops) {
  if (plan.kind == PlanKind::kUntiled) return decoder.Decode(z, ops);
  TileBlender blender(plan, decoder.info().spatial_factor);
  for (size_t i = 0; i < plan.rows.starts.size(); ++i) {
    for (size_t j = 0; j < plan.cols.starts.size(); ++j) {
      blender.Add(i, j, decoder.Decode(TileLatent(z, plan, i, j), ops));
    }
  }
  return blender.Finish(decoder.dtype());
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

std::vector<TilePlan> OomLadder(const TilePlan& plan, const FamilyGeometry& geometry) {
  // Each rung must decode smaller tiles than every rung before it: a retry
  // with tiles no smaller than the ones that ran out of memory would fail
  // again. So a stock plan is followed by the floor tile when that is
  // smaller, and the stock rung is skipped when its tiles are the larger.
  std::vector<TilePlan> ladder = {plan};
  auto area = [](const TilePlan& p) { return p.rows.tile * p.cols.tile; };
  for (TilePlan next : {FloorPlan(plan), StockPlan(plan, geometry)}) {
    if (area(next) < area(ladder.back())) ladder.push_back(std::move(next));
  }
  return ladder;
}

}  // namespace vaedecode::tiling
