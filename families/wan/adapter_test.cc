#include "families/wan/adapter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vaedecode::families::wan {
namespace {

using ::testing::HasSubstr;

TEST(WanAdapter, EveryBandNeedsOneLatentRow) {
  const WanConfig c;
  EXPECT_TRUE(CheckExactSharding(c, {1, 16, 4, 7, 5}, 2).ok());
  EXPECT_TRUE(CheckExactSharding(c, {1, 16, 4, 7, 5}, 7).ok());  // bands of 1 row
  const absl::Status thin = CheckExactSharding(c, {1, 16, 4, 7, 5}, 8);
  EXPECT_EQ(thin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(thin.message()),
              HasSubstr("latent height 7 over 8 ranks leaves a band of 0 rows, thinner than the conv halo"));
}

TEST(WanAdapter, OnlyFramesAndBatchDoNotMatter) {
  const WanConfig c;
  EXPECT_TRUE(CheckExactSharding(c, {2, 16, 1, 3, 100}, 3).ok());
  EXPECT_TRUE(CheckExactSharding(c, {1, 16, 21, 3, 1}, 3).ok());
}

TEST(WanAdapter, WorldSizeOneAndImageLatentsAreRefused) {
  const WanConfig c;
  EXPECT_EQ(CheckExactSharding(c, {1, 16, 4, 7, 5}, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckExactSharding(c, {1, 16, 7, 5}, 2).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::families::wan
