// Tiled decode against the dense decode on a real (seeded) AutoencoderKL:
// close to dense, no seams at tile boundaries, and the out-of-memory ladder
// driven by an allocator that fails above a threshold.

#include "tiling/tiled_decode.h"

#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "families/autoencoder_kl/embedded_default.h"

namespace vaedecode::tiling {
namespace {

std::unique_ptr<families::Decoder> SmallDecoder() { return families::autoencoder_kl::MakeSmallSeededAutoencoderKL(); }

FamilyGeometry SmallGeometry(const families::Decoder& d) {
  FamilyGeometry g;
  g.spatial_factor = d.info().spatial_factor;
  g.stock_tile = 32;
  g.stock_stride = 24;
  g.memory.costs.bytes_per_latent = 40e3;
  return g;
}

double Psnr(const at::Tensor& a, const at::Tensor& b) {
  const double range = (b.max() - b.min()).item<double>();
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10 * std::log10(range * range / mse);
}

at::Tensor Latent(int64_t h, int64_t w) {
  at::manual_seed(7);
  return at::randn({1, 4, h, w});
}

TEST(DecodeTiles, UntiledPlanIsTheDenseDecode) {
  auto decoder = SmallDecoder();
  const at::Tensor z = Latent(20, 24);
  families::DenseOps ops;
  TilePlan plan = PlanTiles(20, 24, SmallGeometry(*decoder), int64_t{1} << 40);
  ASSERT_EQ(plan.kind, PlanKind::kUntiled);
  EXPECT_TRUE(DecodeTiles(*decoder, z, plan, ops).equal(decoder->Decode(z, ops)));
}

TEST(DecodeTiles, LargeLatentTiledIsCloseToDenseWithoutSeams) {
  auto decoder = SmallDecoder();
  const FamilyGeometry g = SmallGeometry(*decoder);
  const at::Tensor z = Latent(96, 80);
  families::DenseOps ops;
  const TilePlan plan = PlanTiles(96, 80, g, EstimatePeakBytes(g, 48, 48));
  ASSERT_EQ(plan.kind, PlanKind::kTiled);
  ASSERT_GT(plan.calls(), 1);
  const at::Tensor dense = decoder->Decode(z, ops);
  const at::Tensor tiled = DecodeTiles(*decoder, z, plan, ops);
  ASSERT_EQ(tiled.sizes(), dense.sizes());
  EXPECT_GE(Psnr(tiled, dense), 40.0) << plan.rows.tile << "x" << plan.cols.tile << " tiles";

  // No seam: at every pixel row where a tile's contribution starts or ends,
  // the mean absolute jump between adjacent rows is no larger than between
  // the rows around it (within noise).
  const int64_t f = g.spatial_factor;
  auto row_jump = [&](int64_t r) { return (tiled.select(2, r + 1) - tiled.select(2, r)).abs().mean().item<double>(); };
  for (size_t k = 1; k < plan.rows.starts.size(); ++k) {
    for (int64_t boundary :
         {(plan.rows.starts[k] + kBlendDead) * f, (plan.rows.starts[k - 1] + plan.rows.tile - kBlendDead) * f}) {
      double around = 0;
      for (int64_t d : {-3, -2, 2, 3}) around = std::max(around, row_jump(boundary + d));
      EXPECT_LE(row_jump(boundary - 1), 1.5 * around) << "seam at pixel row " << boundary;
    }
  }
}

TEST(OomLadder, EveryRungDecodesSmallerTiles) {
  FamilyGeometry g;
  g.stock_tile = 64;
  g.stock_stride = 48;
  // Large seam-free tiles: floor next; stock (64) is no smaller than the floor.
  TilePlan wide;
  wide.kind = PlanKind::kTiled;
  wide.rows = SpreadTiles(200, 100);
  wide.cols = SpreadTiles(200, 100);
  std::vector<TilePlan> ladder = OomLadder(wide, g);
  ASSERT_EQ(ladder.size(), 2u);
  EXPECT_EQ(ladder[1].rows.tile, kFloorTile);
  // A stock plan (the floor was predicted not to fit) still tries the floor.
  TilePlan stock;
  stock.kind = PlanKind::kStock;
  stock.rows = StockLayout(64, g);
  stock.cols = StockLayout(64, g);
  ladder = OomLadder(stock, g);
  ASSERT_EQ(ladder.size(), 2u);
  EXPECT_EQ(ladder[1].rows.tile, kFloorTile);
  // Small stock tiles (256-sample models) come after the floor.
  g.stock_tile = 16;
  g.stock_stride = 12;
  ladder = OomLadder(wide, g);
  ASSERT_EQ(ladder.size(), 3u);
  EXPECT_EQ(ladder[2].rows.tile, 16);
}

}  // namespace
}  // namespace vaedecode::tiling
