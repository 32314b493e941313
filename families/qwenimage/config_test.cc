#include "families/qwenimage/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::qwenimage {
namespace {

using ::testing::HasSubstr;

TEST(QwenImageConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<wan::WanConfig> c = QwenImageConfigFromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->diffusers_class, "AutoencoderKLQwenImage");
  EXPECT_EQ(c->base_dim, 96);
  EXPECT_EQ(c->z_dim, 16);
  EXPECT_EQ(c->out_channels, 3);
  EXPECT_EQ(c->up_block_type(), wan::UpBlockType::kUpBlock);
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_EQ(c->temporal_factor(), 4);
  EXPECT_EQ(c->latents_mean, wan::WanConfig::DefaultLatentsMean());
}

TEST(QwenImageConfig, InputChannelsSetTheImageChannels) {
  // The qwenimage fixture (RGBA, as Qwen-Image-Layered uses it).
  nlohmann::json j = {{"_class_name", "AutoencoderKLQwenImage"},
                      {"base_dim", 4},
                      {"input_channels", 4},
                      {"attn_scales", nlohmann::json::array()},
                      {"dropout", 0.0}};
  absl::StatusOr<wan::WanConfig> c = QwenImageConfigFromJson(j, "qwenimage/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->out_channels, 4);
  EXPECT_EQ(c->image_channels(), 4);
  EXPECT_EQ(c->decoder_dims(), (std::vector<int64_t>{16, 16, 16, 8, 4}));
}

TEST(QwenImageConfig, WanOnlyKeysAreNotQwenImageArguments) {
  // diffusers ignores keys its constructor does not take; so do we.
  nlohmann::json j = {{"is_residual", true}, {"patch_size", 2}, {"out_channels", 12}, {"decoder_base_dim", 7}};
  absl::StatusOr<wan::WanConfig> c = QwenImageConfigFromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->is_residual);
  EXPECT_FALSE(c->patch_size.has_value());
  EXPECT_EQ(c->out_channels, 3);
  EXPECT_EQ(c->decoder_dim(), 96);
}

TEST(QwenImageConfig, SharesWansStructuralChecks) {
  nlohmann::json j = {{"dim_mult", {1, 2}}, {"latents_std", {1.0}}};
  absl::StatusOr<wan::WanConfig> c = QwenImageConfigFromJson(j, "q.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"temperal_downsample\" has 3 entries"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("got 16/1"));
}

}  // namespace
}  // namespace vaedecode::families::qwenimage
