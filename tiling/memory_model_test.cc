#include "tiling/memory_model.h"

#include <gtest/gtest.h>

namespace vaedecode::tiling {
namespace {

MemoryModel Linear(double fixed, double per_latent) {
  MemoryModel m;
  m.costs.fixed_bytes = fixed;
  m.costs.bytes_per_latent = per_latent;
  return m;
}

TEST(RegionPeakBytes, HeadroomOnWhatGrowsWithTheRegionNotOnTheFixedPart) {
  const MemoryModel m = Linear(1000, 10);
  const LatentExtent image{1, 1, 40, 40};
  EXPECT_EQ(RegionPeakBytes(m, image, 10, 10, 100, 1.0), 1000 + 10 * 100);
  EXPECT_EQ(RegionPeakBytes(m, image, 10, 10, 100, kHeadroom), 1000 + 1250);
  // Batch entries scale what grows, not the weights.
  EXPECT_EQ(RegionPeakBytes(m, {3, 1, 40, 40}, 10, 10, 100, 1.0), 1000 + 3 * 10 * 100);
}

TEST(RegionPeakBytes, TheScoresOfQueriesAgainstEveryKeyCanDominate) {
  MemoryModel m = Linear(1000, 10);
  m.costs.attention_fixed_bytes = 500;
  m.costs.attention_bytes_per_latent = 5;
  m.costs.attention_bytes_per_latent_pair = 0.5;
  const LatentExtent image{1, 1, 40, 40};
  // 10x10 queries: convolutions 2000 > attention 500 + 500 + 0.5·100·100.
  // Against the whole image's 1600 keys the scores win.
  EXPECT_EQ(RegionPeakBytes(m, image, 10, 10, 100, 1.0), 500 + 500 + 5000);
  EXPECT_EQ(RegionPeakBytes(m, image, 10, 10, 1600, 1.0), 500 + 500 + 80000);
}

TEST(FrameFactor, FollowsHowTheDecoderHoldsFrames) {
  MemoryModel image = Linear(0, 1);
  EXPECT_EQ(FrameFactor(image, 1), 1.0);
  MemoryModel frame_by_frame = image;  // Wan: one latent frame at a time
  frame_by_frame.temporal_factor = 4;
  frame_by_frame.peak_latent_frames = 1;
  EXPECT_EQ(FrameFactor(frame_by_frame, 1), 1.0);
  EXPECT_EQ(FrameFactor(frame_by_frame, 21), 4.0);  // a later chunk decodes to 4 frames
  MemoryModel whole = frame_by_frame;               // LTX-2: the whole clip at once
  whole.peak_latent_frames = 0;
  EXPECT_EQ(FrameFactor(whole, 1), 1.0);
  EXPECT_EQ(FrameFactor(whole, 5), 17.0);
  MemoryModel window = frame_by_frame;  // HunyuanVideo: windows of 5 latent frames
  window.peak_latent_frames = 5;
  EXPECT_EQ(FrameFactor(window, 3), 9.0);
  EXPECT_EQ(FrameFactor(window, 30), 17.0);
  // And the peak follows: a 5-frame clip held whole costs 17 one-frame decodes.
  EXPECT_EQ(RegionPeakBytes(whole, {1, 5, 8, 8}, 8, 8, 64, 1.0), 17 * 64);
  EXPECT_EQ(RegionPeakBytes(frame_by_frame, {1, 5, 8, 8}, 8, 8, 64, 1.0), 4 * 64);
}

TEST(ExactRankPeakBytes, TheThickestBandWithHalosAgainstEveryKey) {
  MemoryModel m = Linear(0, 1);
  m.costs.attention_bytes_per_latent_pair = 1;
  const LatentExtent image{1, 1, 10, 4};
  // 3 ranks: bands of 4, 3, 3 rows; the first plus two halo rows is 6 rows.
  EXPECT_EQ(ExactRankPeakBytes(m, image, 3), RegionPeakBytes(m, image, 6, 4, 40, kHeadroom));
  // One rank holds the whole latent, never more rows than it has.
  EXPECT_EQ(ExactRankPeakBytes(m, image, 1), DensePeakBytes(m, image));
}

TEST(FloorTilePeakBytes, AFloorTileOrTheWholeShorterSide) {
  const MemoryModel m = Linear(0, 1);
  EXPECT_EQ(FloorTilePeakBytes(m, {1, 1, 100, 100}),
            RegionPeakBytes(m, {1, 1, 100, 100}, kFloorTile, kFloorTile, kFloorTile * kFloorTile, kHeadroom));
  EXPECT_EQ(FloorTilePeakBytes(m, {1, 1, 100, 8}),
            RegionPeakBytes(m, {1, 1, 100, 8}, kFloorTile, 8, kFloorTile * 8, kHeadroom));
}

TEST(TileBudgetBytes, TheTightestMeasuredRankLessTheOutput) {
  EXPECT_EQ(TileBudgetBytes({1000, 600, -1}, 100), 500);
  EXPECT_EQ(TileBudgetBytes({1000, 50}, 100), 0);
  EXPECT_EQ(TileBudgetBytes({-1, -1}, 100), kUnboundedBudget);
  EXPECT_EQ(TileBudgetBytes({}, 100), kUnboundedBudget);
}

}  // namespace
}  // namespace vaedecode::tiling
