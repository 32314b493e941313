#include "parallel/band_partition.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace vaedecode::parallel {
namespace {

TEST(PartitionRowsTest, EvenSplit) {
  EXPECT_EQ(PartitionRows(8, 4), (std::vector<Band>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
}

TEST(PartitionRowsTest, FirstRanksGetTheExtraRows) {
  EXPECT_EQ(PartitionRows(7, 3), (std::vector<Band>{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(PartitionRows(10, 4), (std::vector<Band>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
}

TEST(PartitionRowsTest, WorldSizeOneTakesEverything) {
  EXPECT_EQ(PartitionRows(5, 1), (std::vector<Band>{{0, 5}}));
  EXPECT_EQ(PartitionRows(0, 1), (std::vector<Band>{{0, 0}}));
}

TEST(PartitionRowsTest, FewerRowsThanRanksLeavesTrailingBandsEmpty) {
  const std::vector<Band> bands = PartitionRows(2, 4);
  EXPECT_EQ(bands, (std::vector<Band>{{0, 1}, {1, 2}, {2, 2}, {2, 2}}));
  EXPECT_TRUE(bands[3].empty());
}

TEST(PartitionRowsTest, CoversAllRowsDisjointlyForManyShapes) {
  for (int64_t rows = 0; rows <= 70; ++rows) {
    for (int world = 1; world <= 9; ++world) {
      const std::vector<Band> bands = PartitionRows(rows, world);
      ASSERT_EQ(bands.size(), static_cast<size_t>(world));
      int64_t next = 0;
      int64_t smallest = rows, largest = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(bands[r].begin, next) << rows << "/" << world;
        next = bands[r].end;
        smallest = std::min(smallest, bands[r].size());
        largest = std::max(largest, bands[r].size());
        // Sizes never grow with the rank.
        if (r > 0) {
          EXPECT_LE(bands[r].size(), bands[r - 1].size());
        }
      }
      EXPECT_EQ(next, rows);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(PartitionRowsDeathTest, RejectsBadArguments) {
  EXPECT_DEATH(PartitionRows(-1, 2), "negative");
  EXPECT_DEATH(PartitionRows(4, 0), "world_size");
}

TEST(ShardSpecTest, ForRowsAndAccessors) {
  const ShardSpec spec = ShardSpec::ForRows(/*axis=*/2, /*rows=*/7, /*rank=*/1,
                                            /*world_size=*/3);
  EXPECT_TRUE(spec.IsValid());
  EXPECT_EQ(spec.axis, 2);
  EXPECT_EQ(spec.local_band(), (Band{3, 5}));
  EXPECT_EQ(spec.local_rows(), 2);
  EXPECT_EQ(spec.band(0), (Band{0, 3}));
  EXPECT_EQ(spec.rows_total(), 7);
  EXPECT_EQ(spec.sizes(), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(spec.min_band_rows(), 2);
  EXPECT_FALSE(spec.is_first());
  EXPECT_FALSE(spec.is_last());
  EXPECT_TRUE(ShardSpec::ForRows(2, 7, 0, 3).is_first());
  EXPECT_TRUE(ShardSpec::ForRows(2, 7, 2, 3).is_last());
  const ShardSpec single = ShardSpec::ForRows(3, 9, 0, 1);
  EXPECT_TRUE(single.is_first());
  EXPECT_TRUE(single.is_last());
}

TEST(ShardSpecTest, ScaledMultipliesEveryBandAndKeepsTheRest) {
  const ShardSpec spec = ShardSpec::ForRows(2, 7, 2, 3);
  const ShardSpec up = spec.Scaled(2);
  EXPECT_TRUE(up.IsValid());
  EXPECT_EQ(up.axis, 2);
  EXPECT_EQ(up.rank, 2);
  EXPECT_EQ(up.world_size, 3);
  EXPECT_EQ(up.bands, (std::vector<Band>{{0, 6}, {6, 10}, {10, 14}}));
  EXPECT_EQ(up.rows_total(), 14);
  EXPECT_EQ(up.Scaled(4).rows_total(), 56);
  EXPECT_EQ(spec.Scaled(1), spec);
  // Scaling is not the same as partitioning the scaled height: the band a
  // rank owns follows its rows through the upsample.
  EXPECT_NE(up.bands, PartitionRows(14, 3));
}

TEST(ShardSpecTest, IsValidRejectsInconsistentSpecs) {
  ShardSpec spec = ShardSpec::ForRows(2, 6, 0, 2);
  EXPECT_TRUE(spec.IsValid());
  ShardSpec gap = spec;
  gap.bands[1].begin = 4;
  EXPECT_FALSE(gap.IsValid());
  ShardSpec bad_rank = spec;
  bad_rank.rank = 2;
  EXPECT_FALSE(bad_rank.IsValid());
  ShardSpec missing = spec;
  missing.bands.pop_back();
  EXPECT_FALSE(missing.IsValid());
}

TEST(ShardSpecTest, DebugString) {
  EXPECT_EQ(ShardSpec::ForRows(2, 5, 1, 2).DebugString(), "ShardSpec{axis=2 rank=1/2 bands=[[0,3) [3,5)]}");
}

}  // namespace
}  // namespace vaedecode::parallel
