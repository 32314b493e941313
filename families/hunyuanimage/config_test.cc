#include "families/hunyuanimage/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::hunyuanimage {
namespace {

using ::testing::HasSubstr;

// HunyuanImage-2.1's released config (its structure keys).
nlohmann::json Released() {
  return {{"latent_channels", 64},
          {"out_channels", 3},
          {"block_out_channels", {128, 256, 512, 512, 1024, 1024}},
          {"layers_per_block", 2},
          {"spatial_compression_ratio", 32},
          {"sample_size", 384},
          {"scaling_factor", 0.75289},
          {"upsample_match_channel", true}};
}

TEST(HunyuanImageConfig, TheReleasedModelDecodes32xFromTheWidestLevel) {
  absl::StatusOr<HunyuanImageConfig> c = HunyuanImageConfig::FromJson(Released(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder_widths(), (std::vector<int64_t>{1024, 1024, 512, 512, 256, 128}));
  EXPECT_EQ(c->spatial_factor(), 32);
  EXPECT_EQ(c->conv_in_repeats(), 16);
  const std::vector<UpLayerSpec> layers = c->UpLayers();
  ASSERT_EQ(layers.size(), 6u * 3 + 5);  // 3 resnets per level, 5 upsamplers
  // Level 0: three 1024 resnets, then an upsampler to level 1's width.
  EXPECT_FALSE(layers[2].upsample);
  EXPECT_TRUE(layers[3].upsample);
  EXPECT_EQ(layers[3].in_channels, 1024);
  EXPECT_EQ(layers[3].out_channels, 1024);
  // Level 1's upsampler narrows to 512; the last level has none.
  EXPECT_TRUE(layers[7].upsample);
  EXPECT_EQ(layers[7].out_channels, 512);
  EXPECT_FALSE(layers.back().upsample);
  EXPECT_EQ(layers.back().out_channels, 128);
}

TEST(HunyuanImageConfig, StructureKeysAreRequiredAsInDiffusers) {
  nlohmann::json j = Released();
  j.erase("layers_per_block");
  j["sample_size"] = nullptr;
  absl::StatusOr<HunyuanImageConfig> c = HunyuanImageConfig::FromJson(j, "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("\"layers_per_block\" is required"));
  EXPECT_THAT(c.status().message(), HasSubstr("\"sample_size\" is required"));
  EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
}

TEST(HunyuanImageConfig, TheCompressionRatioIsCheckedAgainstTheLevels) {
  nlohmann::json j = Released();
  j["spatial_compression_ratio"] = 64;  // 6 levels upsample at most 5 times: decoded as 32x, with a warning
  absl::StatusOr<HunyuanImageConfig> c = HunyuanImageConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 32);
  EXPECT_THAT(c->structure_warnings,
              ::testing::ElementsAre("spatial_compression_ratio is 64 but 6 levels upsample 32x; decoded as the "
                                     "levels say (as diffusers does)"));
  j["spatial_compression_ratio"] = 16;  // fine: four upsamplers, the last two levels at full size
  c = HunyuanImageConfig::FromJson(j, "c");
  ASSERT_FALSE(c.ok());  // ... but then level 5 goes 256 -> 128 in a resnet, which diffusers cannot run
  EXPECT_THAT(c.status().message(), HasSubstr("cannot decode"));
  j["block_out_channels"] = {128, 128, 512, 512, 1024, 1024};
  c = HunyuanImageConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 16);
  j["spatial_compression_ratio"] = 24;
  EXPECT_THAT(HunyuanImageConfig::FromJson(j, "c").status().message(), HasSubstr("not a power of 2"));
}

TEST(HunyuanImageConfig, WidthsMustSuitTheNormAndTheShortcuts) {
  nlohmann::json j = Released();
  j["block_out_channels"] = {128, 256, 512, 512, 1024, 1000};
  EXPECT_THAT(HunyuanImageConfig::FromJson(j, "c").status().message(), HasSubstr("multiple of 32"));
  j = Released();
  j["latent_channels"] = 48;  // 1024 is not a multiple of 48
  EXPECT_THAT(HunyuanImageConfig::FromJson(j, "c").status().message(), HasSubstr("conv_in's repeat shortcut"));
  j = Released();
  j["upsample_match_channel"] = false;  // level 2's first resnet would go 1024 -> 512
  EXPECT_THAT(HunyuanImageConfig::FromJson(j, "c").status().message(), HasSubstr("cannot decode"));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanimage
