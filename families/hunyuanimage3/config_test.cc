#include "families/hunyuanimage3/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::hunyuanimage3 {
namespace {

using ::testing::HasSubstr;

// The released model's VAE section (its hub config.json's "vae").
nlohmann::json Released() {
  return {{"_class_name", "AutoencoderKLConv3D"},
          {"block_out_channels", {128, 256, 512, 1024, 1024}},
          {"in_channels", 3},
          {"out_channels", 3},
          {"latent_channels", 32},
          {"layers_per_block", 2},
          {"ffactor_spatial", 16},
          {"ffactor_temporal", 4},
          {"sample_size", 384},
          {"sample_tsize", 96},
          {"downsample_match_channel", true},
          {"upsample_match_channel", true},
          {"scaling_factor", 0.562679178327931},
          {"shift_factor", nullptr}};
}

TEST(HunyuanImage3Config, TheReleasedStructure) {
  absl::StatusOr<HunyuanImage3Config> c = HunyuanImage3Config::FromJson(Released(), "vae/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 16);
  EXPECT_EQ(c->decoded_frames(), 4);  // an image decodes to 4 frames; the last is kept
  EXPECT_EQ(c->conv_in_repeats(), 1024 / 32);
  const std::vector<LevelSpec> up = c->DecoderLevels();
  ASSERT_EQ(up.size(), 5u);
  // Levels 0 and 1 double time too (2^i < 4), 2 and 3 only space, 4 none.
  EXPECT_TRUE(up[0].resample && up[0].temporal);
  EXPECT_TRUE(up[1].resample && up[1].temporal);
  EXPECT_TRUE(up[3].resample && !up[3].temporal);
  EXPECT_FALSE(up[4].resample);
  EXPECT_EQ(up[0].resnets, 3);
  EXPECT_EQ(up[3].resample_out, 128);
  // The encoder halves time at levels 2 and 3 (2^i >= 16 / 4): 4 frames -> 1.
  const std::vector<LevelSpec> down = c->EncoderLevels();
  EXPECT_FALSE(down[1].temporal);
  EXPECT_TRUE(down[2].temporal && down[3].temporal);
  EXPECT_EQ(c->encoder_downsamplers(), 4);
  EXPECT_EQ(c->encoder_width(), 1024);
  EXPECT_TRUE(c->CheckEncoder().ok()) << c->CheckEncoder();
  EXPECT_FALSE(c->shift_factor.has_value());
  EXPECT_TRUE(c->structure_warnings.empty());
  EXPECT_TRUE(c->unread_keys.empty());
}

TEST(HunyuanImage3Config, StructureKeysAreRequired) {
  nlohmann::json j = Released();
  j.erase("ffactor_temporal");
  absl::StatusOr<HunyuanImage3Config> c = HunyuanImage3Config::FromJson(j, "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"ffactor_temporal\" is required"));
}

TEST(HunyuanImage3Config, RefusesWhatTheReleaseCannotBuild) {
  nlohmann::json j = Released();
  j["ffactor_spatial"] = 64;  // 6 upsampling levels of 5
  EXPECT_THAT(std::string(HunyuanImage3Config::FromJson(j, "c").status().message()),
              HasSubstr("need more than the 5 levels"));
  j = Released();
  j["block_out_channels"] = {128, 256, 512, 1024, 1000};
  EXPECT_THAT(std::string(HunyuanImage3Config::FromJson(j, "c").status().message()),
              HasSubstr("not a positive multiple of 32"));
  j = Released();
  j["ffactor_temporal"] = 3;
  EXPECT_THAT(std::string(HunyuanImage3Config::FromJson(j, "c").status().message()), HasSubstr("not a power of 2"));
}

TEST(HunyuanImage3Config, AnEncoderThatCannotFoldTimeToOneFrameIsRefused) {
  // ffactor_temporal 8 over ffactor_spatial 4: the decoder's third level
  // upsamples for time (and, being DCAE, space: 8x), but the encoder halves
  // time only at its two spatial levels, so 8 frames encode to 2.
  nlohmann::json j = Released();
  j["ffactor_spatial"] = 4;
  j["ffactor_temporal"] = 8;
  absl::StatusOr<HunyuanImage3Config> c = HunyuanImage3Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_EQ(c->decoded_frames(), 8);
  ASSERT_EQ(c->structure_warnings.size(), 1u);
  EXPECT_THAT(c->structure_warnings[0], HasSubstr("ffactor_spatial is 4 but the levels upsample 8x"));
  EXPECT_THAT(std::string(c->CheckEncoder().message()), HasSubstr("would encode to 2 latent frames"));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanimage3
