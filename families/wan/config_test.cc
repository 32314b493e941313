#include "families/wan/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::wan {
namespace {

using ::testing::HasSubstr;

TEST(WanConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->base_dim, 96);
  EXPECT_EQ(c->decoder_dim(), 96);
  EXPECT_EQ(c->z_dim, 16);
  EXPECT_EQ(c->dim_mult, (std::vector<int64_t>{1, 2, 4, 4}));
  EXPECT_EQ(c->num_res_blocks, 2);
  EXPECT_EQ(c->temperal_downsample, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c->latents_mean.size(), 16u);
  EXPECT_DOUBLE_EQ(c->latents_std.back(), 1.916);
  EXPECT_FALSE(c->is_residual);
  EXPECT_FALSE(c->patch_size.has_value());
  EXPECT_EQ(c->up_block_type(), UpBlockType::kUpBlock);
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_EQ(c->temporal_factor(), 4);
  EXPECT_EQ(c->image_channels(), 3);
  EXPECT_EQ(c->decoder_dims(), (std::vector<int64_t>{384, 384, 384, 192, 96}));
}

TEST(WanConfig, TemporalUpsamplingIsTheReversedDownsampling) {
  // temperal_downsample [F, T, T] -> decoder up blocks 0 and 1 double time,
  // block 2 only space, block 3 (the last) neither.
  WanConfig c;
  EXPECT_TRUE(c.up_block_upsamples_time(0));
  EXPECT_TRUE(c.up_block_upsamples_time(1));
  EXPECT_FALSE(c.up_block_upsamples_time(2));
  EXPECT_FALSE(c.up_block_upsamples_time(3));
  c.temperal_downsample = {true, false, false};
  EXPECT_FALSE(c.up_block_upsamples_time(0));
  EXPECT_TRUE(c.up_block_upsamples_time(2));
  EXPECT_EQ(c.temporal_factor(), 2);
}

TEST(WanConfig, Wan22Layout) {
  // The wan22 fixture's config: residual up blocks, decoder widths from
  // decoder_base_dim, a 2x2 unpatchify of 12 = 3·2·2 channels.
  nlohmann::json j = {{"_class_name", "AutoencoderKLWan"},
                      {"base_dim", 4},
                      {"decoder_base_dim", 5},
                      {"z_dim", 48},
                      {"is_residual", true},
                      {"in_channels", 12},
                      {"out_channels", 12},
                      {"patch_size", 2},
                      {"scale_factor_spatial", 16},
                      {"latents_mean", std::vector<double>(48, 0.1)},
                      {"latents_std", std::vector<double>(48, 0.5)}};
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(j, "wan22/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder_dim(), 5);
  EXPECT_EQ(c->decoder_dims(), (std::vector<int64_t>{20, 20, 20, 10, 5}));
  EXPECT_EQ(c->up_block_type(), UpBlockType::kResidualUpBlock);
  EXPECT_EQ(c->patch(), 2);
  EXPECT_EQ(c->spatial_factor(), 16);
  EXPECT_EQ(c->temporal_factor(), 4);
  EXPECT_EQ(c->image_channels(), 3);
}

TEST(WanConfig, NullDecoderBaseDimAndPatchSizeMeanUnset) {
  nlohmann::json j = {{"base_dim", 5}, {"decoder_base_dim", nullptr}, {"patch_size", nullptr}};
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->decoder_base_dim.has_value());
  EXPECT_EQ(c->decoder_dims(), (std::vector<int64_t>{20, 20, 20, 10, 5}));
  EXPECT_EQ(c->patch(), 1);
}

TEST(WanConfig, RejectsInconsistentStructure) {
  nlohmann::json j = {{"dim_mult", {1, 2, 4, 4}},
                      {"temperal_downsample", {true, true}},
                      {"z_dim", 8},
                      {"out_channels", 6},
                      {"patch_size", 2}};
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(j, "vae/config.json");
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  EXPECT_THAT(m, HasSubstr("vae/config.json"));
  EXPECT_THAT(m, HasSubstr("\"temperal_downsample\" has 2 entries; dim_mult's 4 levels need 3"));
  EXPECT_THAT(m, HasSubstr("must have z_dim (8) entries, got 16/16"));
  EXPECT_THAT(m, HasSubstr("out_channels 6 is not a multiple of patch_size² (4)"));
}

TEST(WanConfig, RejectsWrongTypes) {
  nlohmann::json j = {{"dim_mult", "1,2,4,4"}, {"is_residual", 1}};
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(j, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("dim_mult"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("is_residual"));
}

TEST(WanConfig, UpBlockTypesHaveTheirDiffusersNames) {
  EXPECT_STREQ(UpBlockTypeName(UpBlockType::kUpBlock), "WanUpBlock");
  EXPECT_STREQ(UpBlockTypeName(UpBlockType::kResidualUpBlock), "WanResidualUpBlock");
}

TEST(WanConfig, ScaleFactorsThatDisagreeWithTheStructureAreWarnedAbout) {
  // Wan 2.2's 2x2 unpatchify makes it 16x: a config saying 8x decodes as
  // the blocks say (diffusers' decoder never reads the key), with a warning.
  nlohmann::json j = {{"base_dim", 4},
                      {"z_dim", 48},
                      {"is_residual", true},
                      {"in_channels", 12},
                      {"out_channels", 12},
                      {"patch_size", 2},
                      {"scale_factor_spatial", 8},
                      {"latents_mean", std::vector<double>(48, 0.1)},
                      {"latents_std", std::vector<double>(48, 0.5)}};
  absl::StatusOr<WanConfig> c = WanConfig::FromJson(j, "wan22/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 16);
  EXPECT_THAT(c->structure_warnings,
              ::testing::ElementsAre("scale_factor_spatial is 8 but the decoder's blocks upsample 16x in space; "
                                     "decoded as the blocks say (as diffusers does)"));
  j["scale_factor_spatial"] = 16;
  j["scale_factor_temporal"] = 2;  // temperal_downsample [F, T, T] is 4x
  c = WanConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->structure_warnings, ::testing::ElementsAre(HasSubstr("scale_factor_temporal is 2")));
  j.erase("scale_factor_temporal");  // absent, or agreeing: nothing to say
  c = WanConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->structure_warnings.empty());
}

}  // namespace
}  // namespace vaedecode::families::wan
