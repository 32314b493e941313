#include "families/hunyuanvideo/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::hunyuanvideo {
namespace {

using ::testing::HasSubstr;

TEST(HunyuanVideoConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<HunyuanVideoConfig> c = HunyuanVideoConfig::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->latent_channels, 16);
  EXPECT_EQ(c->block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_DOUBLE_EQ(c->scaling_factor, 0.476986);
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_EQ(c->temporal_factor(), 4);
  EXPECT_EQ(c->tile_latent_min_frames(), 4);
  EXPECT_EQ(c->tile_latent_stride_frames(), 3);
  EXPECT_EQ(c->blend_frames(), 4);
}

TEST(HunyuanVideoConfig, UpBlocksUpsampleAsTheDecoderBuildsThem) {
  absl::StatusOr<HunyuanVideoConfig> c =
      HunyuanVideoConfig::FromJson({{"block_out_channels", {4, 8, 16, 16}}, {"norm_num_groups", 4}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<UpBlockSpec> ups = c->UpBlocks();
  ASSERT_EQ(ups.size(), 4u);
  // Space in blocks 0-2 (log2 8 = 3), time in blocks 1-2 (log2 4 = 2, not the last).
  EXPECT_TRUE(ups[0].upsample_space && !ups[0].upsample_time);
  EXPECT_TRUE(ups[1].upsample_space && ups[1].upsample_time);
  EXPECT_TRUE(ups[2].upsample_space && ups[2].upsample_time);
  EXPECT_FALSE(ups[3].upsample_space || ups[3].upsample_time);
  EXPECT_EQ(ups[0].in_channels, 16);
  EXPECT_EQ(ups[2].in_channels, 16);
  EXPECT_EQ(ups[2].out_channels, 8);
  EXPECT_EQ(ups[3].out_channels, 4);
  EXPECT_EQ(ups[1].num_layers, 3);
}

TEST(HunyuanVideoConfig, RejectsWhatTheDecoderCannotBuild) {
  absl::StatusOr<HunyuanVideoConfig> c = HunyuanVideoConfig::FromJson({{"temporal_compression_ratio", 8}}, "cfg");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("temporal_compression_ratio 8 is not supported"));
  c = HunyuanVideoConfig::FromJson(
      {{"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}}}, "cfg");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("only HunyuanVideoUpBlock3D"));
  c = HunyuanVideoConfig::FromJson({{"block_out_channels", {4, 6}}, {"norm_num_groups", 4}}, "cfg");
  EXPECT_FALSE(c.ok());
  c = HunyuanVideoConfig::FromJson({{"block_out_channels", {4, 8}}, {"norm_num_groups", 4}}, "cfg");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("2 levels upsample 4x in space and 2x in time"));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanvideo
