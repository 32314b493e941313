#include "families/hunyuanvideo15/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::hunyuanvideo15 {
namespace {

using ::testing::HasSubstr;

TEST(HunyuanVideo15Config, EmptyConfigIsTheReleasedModel) {
  absl::StatusOr<HunyuanVideo15Config> c = HunyuanVideo15Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->latent_channels, 32);
  EXPECT_EQ(c->decoder_widths(), (std::vector<int64_t>{1024, 1024, 512, 256, 128}));
  EXPECT_EQ(c->spatial_factor(), 16);
  EXPECT_EQ(c->temporal_factor(), 4);
  EXPECT_EQ(c->conv_in_repeats(), 32);
  EXPECT_DOUBLE_EQ(c->scaling_factor, 1.03682);
  const std::vector<UpBlockSpec> blocks = c->UpBlocks();
  ASSERT_EQ(blocks.size(), 5u);
  // Levels 0-1 upsample in space and time, 2-3 in space, 4 not at all.
  EXPECT_TRUE(blocks[0].upsample_time);
  EXPECT_EQ(blocks[0].upsample_out_channels, 1024);
  EXPECT_TRUE(blocks[1].upsample_time);
  EXPECT_EQ(blocks[1].upsample_out_channels, 512);
  EXPECT_FALSE(blocks[2].upsample_time);
  EXPECT_EQ(blocks[2].upsample_out_channels, 256);
  EXPECT_EQ(blocks[3].upsample_out_channels, 128);
  EXPECT_EQ(blocks[4].upsample_out_channels, 0);
  EXPECT_EQ(blocks[4].in_channels, 128);
  EXPECT_EQ(blocks[4].num_layers, 3);
}

TEST(HunyuanVideo15Config, CompressionRatiosAreCheckedAgainstTheLevels) {
  absl::StatusOr<HunyuanVideo15Config> c =
      HunyuanVideo15Config::FromJson({{"block_out_channels", {128, 256, 512, 1024}}}, "cfg.json");
  ASSERT_FALSE(c.ok());  // four levels: the last would need the 16x ratio's fourth upsampler
  EXPECT_THAT(c.status().message(), HasSubstr("too few for the compression ratios"));
  EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
  c = HunyuanVideo15Config::FromJson({{"spatial_compression_ratio", 4}, {"temporal_compression_ratio", 8}}, "c");
  ASSERT_FALSE(c.ok());  // time upsampling also upsamples space: 8x, not 4x
  EXPECT_THAT(c.status().message(), HasSubstr("not the configured"));
  c = HunyuanVideo15Config::FromJson({{"spatial_compression_ratio", 12}}, "c");
  EXPECT_THAT(c.status().message(), HasSubstr("powers of 2"));
  c = HunyuanVideo15Config::FromJson({{"spatial_compression_ratio", 8}, {"temporal_compression_ratio", 2}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();  // fewer upsamplers than levels is fine
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_EQ(c->temporal_factor(), 2);
}

TEST(HunyuanVideo15Config, WidthsMustSuitTheShortcuts) {
  absl::StatusOr<HunyuanVideo15Config> c = HunyuanVideo15Config::FromJson({{"latent_channels", 48}}, "c");
  EXPECT_THAT(c.status().message(), HasSubstr("conv_in's repeat shortcut"));
  // 1024 -> 96 with time: 8 · 96 / 1024 is no whole repeat.
  c = HunyuanVideo15Config::FromJson({{"block_out_channels", {128, 256, 512, 96, 1024}}}, "c");
  EXPECT_THAT(c.status().message(), HasSubstr("no whole channel repeat"));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanvideo15
