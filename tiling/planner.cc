#include "tiling/planner.h"

#include <algorithm>
#include <cmath>

namespace vaedecode::tiling {

int64_t PredictPeakBytes(const FamilyGeometry& g, int64_t rows, int64_t cols) {
  return RegionPeakBytes(g.memory, g.latent, rows, cols, rows * cols, 1.0);
}

int64_t EstimatePeakBytes(const FamilyGeometry& g, int64_t rows, int64_t cols) {
  return RegionPeakBytes(g.memory, g.latent, rows, cols, rows * cols, kHeadroom);
}

AxisLayout SpreadTiles(int64_t length, int64_t tile) {
  AxisLayout out;
  out.length = length;
  out.tile = std::min(tile, length);
  if (out.tile >= length) {
    out.starts = {0};
    return out;
  }
  // Fewest tiles whose even spread keeps every overlap >= kMinOverlap.
  const int64_t stride_max = out.tile - kMinOverlap;
  const int64_t n = 1 + (length - out.tile + stride_max - 1) / stride_max;
  for (int64_t k = 0; k < n; ++k) {
    // Rounded even spread: first at 0, last ending exactly at the edge.
    out.starts.push_back((k * (length - out.tile) + (n - 1) / 2) / (n - 1));
  }
  return out;
}

AxisLayout StockLayout(int64_t length, const FamilyGeometry& g) {
  AxisLayout out;
  out.length = length;
  out.tile = std::min(g.stock_tile, length);
  // diffusers cuts its last tiles short at the edge; here the last tile
  // moves back to end there at full size, like every other layout (one tile
  // shape per plan, blended by the same weights).
  for (int64_t i = 0;; i += std::max<int64_t>(1, g.stock_stride)) {
    const int64_t start = std::min(i, length - out.tile);
    out.starts.push_back(start);
    if (start + out.tile >= length) break;
  }
  return out;
}

int64_t StockDecodedLatents(int64_t length, const FamilyGeometry& g) {
  int64_t total = 0;
  for (int64_t i = 0; i < length; i += g.stock_stride) total += std::min(g.stock_tile, length - i);
  return total;
}

namespace {

// Candidate tile lengths along one axis, widest first.
std::vector<int64_t> Candidates(int64_t length) {
  std::vector<int64_t> out;
  if (length <= kFloorTile) return {length};
  for (int64_t t = length; t >= kFloorTile; --t) out.push_back(t);
  return out;
}

}  // namespace

TilePlan PlanTiles(int64_t rows, int64_t cols, const FamilyGeometry& g, int64_t budget_bytes) {
  TilePlan plan;
  const int64_t whole = EstimatePeakBytes(g, rows, cols);
  if (whole <= budget_bytes) {
    plan.kind = PlanKind::kUntiled;
    plan.rows = SpreadTiles(rows, rows);
    plan.cols = SpreadTiles(cols, cols);
    plan.peak_bytes = whole;
    plan.reason = "the whole latent fits";
    return plan;
  }
  const int64_t stock_rows = StockDecodedLatents(rows, g);
  const int64_t stock_cols = StockDecodedLatents(cols, g);
  bool found = false, found_within_stock = false;
  TilePlan best;
  for (int64_t th : Candidates(rows)) {
    const AxisLayout r = SpreadTiles(rows, th);
    for (int64_t tw : Candidates(cols)) {
      const int64_t peak = EstimatePeakBytes(g, r.tile, std::min(tw, cols));
      if (peak > budget_bytes) continue;
      const AxisLayout c = SpreadTiles(cols, tw);
      const bool within_stock = r.decoded() <= stock_rows && c.decoded() <= stock_cols;
      const int64_t calls = static_cast<int64_t>(r.starts.size() * c.starts.size());
      // Prefer layouts within the stock budget of decoded latents; then the
      // fewest calls; then the widest (largest-area) tile.
      bool better = !found || (within_stock && !found_within_stock);
      if (found && within_stock == found_within_stock) {
        better = calls < best.calls() || (calls == best.calls() && r.tile * c.tile > best.rows.tile * best.cols.tile);
      }
      if (better) {
        best.kind = PlanKind::kTiled;
        best.rows = r;
        best.cols = c;
        best.peak_bytes = peak;
        found = true;
        found_within_stock = within_stock;
      }
    }
  }
  if (found) {
    best.reason = found_within_stock ? "largest seam-free tiles that fit the budget"
                                     : "seam-free floor tiles (decode more latents than stock)";
    return best;
  }
  // Even the floor tile does not fit. Stock tiles can be smaller (a model
  // whose diffusers tile is under 32 latents): those if they fit; else the
  // smaller of the two, marked as not fitting, so the caller refuses the
  // decode rather than attempting a plan predicted to run out of memory.
  plan.kind = PlanKind::kStock;
  plan.rows = StockLayout(rows, g);
  plan.cols = StockLayout(cols, g);
  plan.peak_bytes = EstimatePeakBytes(g, plan.rows.tile, plan.cols.tile);
  plan.reason = "even the 32-latent floor tile does not fit the budget: stock tiles";
  if (plan.peak_bytes <= budget_bytes) return plan;
  TilePlan floor;
  floor.kind = PlanKind::kTiled;
  floor.rows = SpreadTiles(rows, kFloorTile);
  floor.cols = SpreadTiles(cols, kFloorTile);
  floor.peak_bytes = EstimatePeakBytes(g, floor.rows.tile, floor.cols.tile);
  TilePlan& smallest = floor.peak_bytes < plan.peak_bytes ? floor : plan;
  // Without the headroom the prediction may still fit (it is measured to
  // within a few percent): worth an attempt; beyond it, refused.
  smallest.fits = PredictPeakBytes(g, smallest.rows.tile, smallest.cols.tile) <= budget_bytes;
  smallest.reason = smallest.fits ? "the smallest tiles fit the budget only without headroom"
                                  : "even the smallest tiles do not fit the budget";
  return smallest;
}

std::vector<std::vector<float>> AxisBlendWeights(const AxisLayout& layout, int64_t f) {
  const size_t n = layout.starts.size();
  std::vector<std::vector<float>> raw(n, std::vector<float>(static_cast<size_t>(layout.tile * f), 1.0f));
  // Weight at `pixels_from_edge` from an edge shared over `overlap` latents:
  // dead, then a ramp. Overlaps too short for both (stock layouts with
  // small tiles) cross-fade linearly over the whole overlap instead, so
  // some tile always has weight.
  auto ramp = [f](int64_t pixels_from_edge, int64_t overlap) {
    const bool roomy = overlap >= 2 * kBlendDead + kBlendRamp;
    const double dead = roomy ? kBlendDead : 0.0;
    const double length = roomy ? kBlendRamp : static_cast<double>(std::max<int64_t>(1, overlap));
    const double latents = (static_cast<double>(pixels_from_edge) + (roomy ? 0.0 : 0.5)) / static_cast<double>(f);
    if (latents < dead) return 0.0f;
    return static_cast<float>(std::min(1.0, (latents - dead) / length));
  };
  for (size_t k = 0; k < n; ++k) {
    const int64_t pixels = layout.tile * f;
    const int64_t above = k > 0 ? layout.starts[k - 1] + layout.tile - layout.starts[k] : 0;
    const int64_t below = k + 1 < n ? layout.starts[k] + layout.tile - layout.starts[k + 1] : 0;
    for (int64_t p = 0; p < pixels; ++p) {
      float w = 1.0f;
      if (k > 0) w = std::min(w, ramp(p, above));                   // shares its top/left edge
      if (k + 1 < n) w = std::min(w, ramp(pixels - 1 - p, below));  // shares its bottom/right edge
      raw[k][static_cast<size_t>(p)] = w;
    }
  }
  // Normalise: sum over tiles covering each pixel of the axis.
  std::vector<double> total(static_cast<size_t>(layout.length * f), 0.0);
  for (size_t k = 0; k < n; ++k) {
    for (int64_t p = 0; p < layout.tile * f; ++p) total[static_cast<size_t>(layout.starts[k] * f + p)] += raw[k][p];
  }
  for (size_t k = 0; k < n; ++k) {
    for (int64_t p = 0; p < layout.tile * f; ++p) {
      const double t = total[static_cast<size_t>(layout.starts[k] * f + p)];
      raw[k][static_cast<size_t>(p)] = static_cast<float>(raw[k][static_cast<size_t>(p)] / t);
    }
  }
  return raw;
}

}  // namespace vaedecode::tiling
