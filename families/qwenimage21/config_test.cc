#include "families/qwenimage21/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::qwenimage21 {
namespace {

using ::testing::HasSubstr;

TEST(QwenImage21Config, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<wan::WanConfig> c = QwenImage21ConfigFromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->diffusers_class, "AutoencoderKLQwenImage21");
  EXPECT_TRUE(c->image_convs);
  EXPECT_EQ(c->base_dim, 96);
  EXPECT_EQ(c->decoder_dim(), 144);
  EXPECT_EQ(c->z_dim, 64);
  EXPECT_EQ(c->in_channels, 4);
  EXPECT_EQ(c->image_channels(), 4);
  EXPECT_EQ(c->up_block_type(), wan::UpBlockType::kResidualUpBlock);
  EXPECT_EQ(c->spatial_factor(), 16);
  ASSERT_EQ(c->latents_mean.size(), 64u);
  EXPECT_DOUBLE_EQ(c->latents_mean.front(), 0.5126);
  EXPECT_DOUBLE_EQ(c->latents_std.back(), 3.8161);
  EXPECT_TRUE(c->structure_warnings.empty());
}

TEST(QwenImage21Config, NullDecoderBaseDimMeansBaseDim) {
  absl::StatusOr<wan::WanConfig> c = QwenImage21ConfigFromJson({{"base_dim", 8}, {"decoder_base_dim", nullptr}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder_dim(), 8);
}

TEST(QwenImage21Config, SpatialKeyThatDisagreesWarnsTheTemporalOneIsMoot) {
  // T = 1: scale_factor_temporal describes nothing this decoder does.
  nlohmann::json j = {{"scale_factor_spatial", 8}, {"scale_factor_temporal", 4}};
  absl::StatusOr<wan::WanConfig> c = QwenImage21ConfigFromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->structure_warnings.size(), 1u);
  EXPECT_THAT(c->structure_warnings[0], HasSubstr("scale_factor_spatial is 8 but the decoder's blocks upsample 16x"));
}

TEST(QwenImage21Config, SharesWansStructuralChecks) {
  nlohmann::json j = {{"dim_mult", {1, 2}}, {"latents_std", {1.0}}};
  absl::StatusOr<wan::WanConfig> c = QwenImage21ConfigFromJson(j, "q.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"temperal_downsample\" has 4 entries"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("got 64/1"));
}

}  // namespace
}  // namespace vaedecode::families::qwenimage21
