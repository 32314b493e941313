#include "tiling/planner.h"

#include <cmath>

#include <gtest/gtest.h>

namespace vaedecode::tiling {
namespace {

FamilyGeometry Sd() {
  FamilyGeometry g;  // SD 1.x: 512-pixel stock tiles = 64 latents, stride 48
  g.spatial_factor = 8;
  g.stock_tile = 64;
  g.stock_stride = 48;
  g.memory.costs.bytes_per_latent = 0.17 * 1048576;
  return g;
}

void ExpectAxisInvariants(const AxisLayout& a, const std::string& where) {
  ASSERT_FALSE(a.starts.empty()) << where;
  EXPECT_EQ(a.starts.front(), 0) << where;
  EXPECT_EQ(a.starts.back() + a.tile, a.length) << where << ": last tile must end at the edge at full size";
  EXPECT_TRUE(a.tile >= kFloorTile || a.tile == a.length) << where << ": tile " << a.tile;
  for (size_t k = 1; k < a.starts.size(); ++k) {
    EXPECT_GT(a.starts[k], a.starts[k - 1]) << where;
    EXPECT_GE(a.starts[k - 1] + a.tile - a.starts[k], kMinOverlap) << where << ": overlap at tile " << k;
  }
}

void ExpectWeightsSumToOne(const AxisLayout& a, int64_t f, const std::string& where) {
  const std::vector<std::vector<float>> w = AxisBlendWeights(a, f);
  std::vector<double> sum(static_cast<size_t>(a.length * f), 0.0);
  for (size_t k = 0; k < a.starts.size(); ++k) {
    ASSERT_EQ(static_cast<int64_t>(w[k].size()), a.tile * f);
    for (int64_t p = 0; p < a.tile * f; ++p) sum[static_cast<size_t>(a.starts[k] * f + p)] += w[k][p];
  }
  for (size_t p = 0; p < sum.size(); ++p) ASSERT_NEAR(sum[p], 1.0, 1e-5) << where << " pixel " << p;
}

TEST(SpreadTiles, EveryLengthGivesFullEdgeAlignedOverlappingTiles) {
  for (int64_t length = 1; length <= 300; ++length) {
    for (int64_t tile : {32, 40, 64, 100, 128}) {
      const AxisLayout a = SpreadTiles(length, tile);
      ExpectAxisInvariants(a, "length " + std::to_string(length) + " tile " + std::to_string(tile));
      ExpectWeightsSumToOne(a, 2, "length " + std::to_string(length) + " tile " + std::to_string(tile));
    }
  }
}

TEST(StockLayout, EveryLengthGivesFullEdgeAlignedTilesThatBlend) {
  // AutoencoderKL's stock tiles at 512 and 256 samples, and tiny ones whose
  // overlap is shorter than the dead zones.
  for (auto [tile, stride] : {std::pair<int64_t, int64_t>{64, 48}, {32, 24}, {8, 6}, {4, 3}}) {
    FamilyGeometry g = Sd();
    g.stock_tile = tile;
    g.stock_stride = stride;
    for (int64_t length = 1; length <= 300; ++length) {
      const AxisLayout a = StockLayout(length, g);
      const std::string where = "length " + std::to_string(length) + " stock " + std::to_string(tile);
      ASSERT_FALSE(a.starts.empty()) << where;
      EXPECT_EQ(a.tile, std::min(tile, length)) << where;
      EXPECT_EQ(a.starts.front(), 0) << where;
      EXPECT_EQ(a.starts.back() + a.tile, length) << where;
      for (size_t k = 1; k < a.starts.size(); ++k) {
        EXPECT_GT(a.starts[k], a.starts[k - 1]) << where;
        EXPECT_LE(a.starts[k] - a.starts[k - 1], stride) << where;  // never a gap
      }
      ExpectWeightsSumToOne(a, 8, where);
    }
  }
}

TEST(BlendWeights, ZeroNearSharedEdgesAndFullAwayFromThem) {
  const AxisLayout a = SpreadTiles(80, 48);  // two tiles: [0, 48) and [32, 80)
  ASSERT_EQ(a.starts.size(), 2u);
  const int64_t f = 8;
  const auto w = AxisBlendWeights(a, f);
  // Second tile: its first 4 latents (32 px) are dead, full weight after 12.
  for (int64_t p = 0; p < kBlendDead * f; ++p) EXPECT_EQ(w[1][p], 0.0f) << p;
  EXPECT_GT(w[1][(kBlendDead + 1) * f], 0.0f);
  // Far from any shared edge a tile owns its pixels alone.
  EXPECT_EQ(w[0][0], 1.0f);
  EXPECT_EQ(w[1][48 * f - 1], 1.0f);
}

TEST(EstimatePeakBytes, TheLargerOfTheConvolutionAndAttentionPhases) {
  FamilyGeometry g = Sd();
  g.memory.costs.fixed_bytes = 1000;
  g.memory.costs.bytes_per_latent = 100;
  g.memory.costs.attention_fixed_bytes = 2000;
  g.memory.costs.attention_bytes_per_latent = 50;
  g.memory.costs.attention_bytes_per_latent_pair = 0.01;
  // 10x10: convolutions 1000 + 100·100·1.25 = 13500 > attention 2000 + (5000 + 100)·1.25.
  EXPECT_EQ(PredictPeakBytes(g, 10, 10), 11000);
  EXPECT_EQ(EstimatePeakBytes(g, 10, 10), 13500);
  // 100x100: the scores (0.01 per latent pair, 10⁸ pairs) win.
  EXPECT_EQ(PredictPeakBytes(g, 100, 100), 2000 + 50 * 10000 + 1000000);
  EXPECT_GT(EstimatePeakBytes(g, 100, 100), static_cast<int64_t>(g.memory.costs.fixed_bytes + 100 * 10000 * kHeadroom));
  // So plans for a tight budget pick smaller tiles than a linear cost would.
  FamilyGeometry linear = g;
  linear.memory.costs.attention_bytes_per_latent_pair = 0;
  const int64_t budget = EstimatePeakBytes(linear, 96, 96);
  EXPECT_LT(PlanTiles(200, 200, g, budget).rows.tile * PlanTiles(200, 200, g, budget).cols.tile,
            PlanTiles(200, 200, linear, budget).rows.tile * PlanTiles(200, 200, linear, budget).cols.tile);
}

TEST(PlanTiles, WholeLatentWhenItFits) {
  const TilePlan p = PlanTiles(64, 64, Sd(), int64_t{1} << 40);
  EXPECT_EQ(p.kind, PlanKind::kUntiled);
  EXPECT_EQ(p.calls(), 1);
}

TEST(PlanTiles, InvariantsAtEveryLengthAndBudget) {
  const FamilyGeometry g = Sd();
  for (int64_t length = 1; length <= 300; length += 1) {
    int64_t previous_calls = -1;
    for (double mib : {32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0}) {
      const int64_t budget = static_cast<int64_t>(mib * 1048576);
      const TilePlan p = PlanTiles(length, 96, g, budget);
      const std::string where = "length " + std::to_string(length) + " budget " + std::to_string(mib) + " MiB";
      if (!p.fits) {
        // Refused, never attempted: even its smallest tiles are over the budget.
        EXPECT_GT(PredictPeakBytes(g, std::min<int64_t>(kFloorTile, length), kFloorTile), budget) << where;
        EXPECT_GT(p.peak_bytes, budget) << where;
        continue;
      }
      ExpectAxisInvariants(p.rows, where + " rows");
      ExpectAxisInvariants(p.cols, where + " cols");
      if (p.peak_bytes > budget) {  // the smallest tiles, fitting only without headroom
        EXPECT_LE(PredictPeakBytes(g, p.rows.tile, p.cols.tile), budget) << where;
      }
      if (p.kind == PlanKind::kTiled && p.reason.find("largest") != std::string::npos) {
        EXPECT_LE(p.rows.decoded(), StockDecodedLatents(length, g)) << where;
        EXPECT_LE(p.cols.decoded(), StockDecodedLatents(96, g)) << where;
      }
      // More memory never means more decoder calls.
      if (previous_calls >= 0) {
        EXPECT_LE(p.calls(), previous_calls) << where;
      }
      previous_calls = p.calls();
    }
  }
}

TEST(PlanTiles, NothingThatFitsIsMarkedAsNotFitting) {
  // SD's stock tiles (64) are larger than the floor tile: the floor tiles
  // are the smallest, and they do not fit either.
  const TilePlan p = PlanTiles(200, 200, Sd(), 1 << 20);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.rows.tile, kFloorTile);
  EXPECT_EQ(p.peak_bytes, EstimatePeakBytes(Sd(), kFloorTile, kFloorTile));
  // A budget that fits the floor tile plans, and fits.
  EXPECT_TRUE(PlanTiles(200, 200, Sd(), EstimatePeakBytes(Sd(), kFloorTile, kFloorTile)).fits);
}

TEST(PlanTiles, StockTilesSmallerThanTheFloorWhenOnlyTheyFit) {
  FamilyGeometry g = Sd();
  g.stock_tile = 16;
  g.stock_stride = 12;
  const int64_t budget = EstimatePeakBytes(g, 16, 16);
  ASSERT_LT(budget, EstimatePeakBytes(g, kFloorTile, kFloorTile));
  const TilePlan p = PlanTiles(200, 200, g, budget);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.kind, PlanKind::kStock);
  EXPECT_EQ(p.rows.tile, 16);
  // diffusers' stride; the last tile ends at the edge at full size.
  EXPECT_EQ(p.rows.starts.front(), 0);
  EXPECT_EQ(p.rows.starts[1], 12);
  EXPECT_EQ(p.rows.starts.back(), 184);
  EXPECT_NE(p.reason.find("floor"), std::string::npos);
}

TEST(PlanTiles, PrefersFewerCallsThenWiderTiles) {
  // 200x200 latents with room for 128x128 tiles: a 2x2 grid would do, but
  // full-height strips 200 wide x 81 tall (area 16200 <= 128²) need 3 calls.
  const FamilyGeometry g = Sd();
  const int64_t budget = EstimatePeakBytes(g, 128, 128);
  const TilePlan p = PlanTiles(200, 200, g, budget);
  EXPECT_EQ(p.kind, PlanKind::kTiled);
  EXPECT_EQ(p.calls(), 3);
  EXPECT_LE(p.rows.tile * p.cols.tile, 128 * 128);
  // Among 3-call layouts, the widest tile: no 3-call layout has a larger area.
  for (int64_t th = 32; th <= 200; ++th) {
    for (int64_t tw = 32; tw <= 200; ++tw) {
      if (EstimatePeakBytes(g, th, tw) > budget) continue;
      const int64_t calls =
          static_cast<int64_t>(SpreadTiles(200, th).starts.size() * SpreadTiles(200, tw).starts.size());
      EXPECT_GE(calls, 3);
      if (calls == 3) {
        EXPECT_LE(th * tw, p.rows.tile * p.cols.tile);
      }
    }
  }
}

}  // namespace
}  // namespace vaedecode::tiling
