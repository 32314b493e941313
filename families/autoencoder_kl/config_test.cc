#include "families/autoencoder_kl/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::autoencoder_kl {
namespace {

using ::testing::HasSubstr;

TEST(AutoencoderKLConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<AutoencoderKLConfig> c = AutoencoderKLConfig::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->latent_channels, 4);
  EXPECT_EQ(c->block_out_channels, std::vector<int64_t>{64});
  EXPECT_EQ(c->layers_per_block, 1);
  EXPECT_EQ(c->norm_num_groups, 32);
  EXPECT_TRUE(c->use_post_quant_conv);
  EXPECT_TRUE(c->mid_block_add_attention);
  EXPECT_DOUBLE_EQ(c->scaling_factor, 0.18215);
  EXPECT_FALSE(c->shift_factor.has_value());
  EXPECT_EQ(c->spatial_factor(), 1);
}

TEST(AutoencoderKLConfig, Flux1StyleConfig) {
  nlohmann::json j = {
      {"latent_channels", 16},
      {"block_out_channels", {128, 256, 512, 512}},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
      {"layers_per_block", 2},
      {"use_post_quant_conv", false},
      {"use_quant_conv", false},
      {"scaling_factor", 0.3611},
      {"shift_factor", 0.1159}};
  absl::StatusOr<AutoencoderKLConfig> c = AutoencoderKLConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spatial_factor(), 8);
  EXPECT_FALSE(c->use_post_quant_conv);
  EXPECT_DOUBLE_EQ(*c->shift_factor, 0.1159);
}

TEST(AutoencoderKLConfig, SdxlStatisticsNeedOneEntryPerChannel) {
  nlohmann::json j = {{"latents_mean", {0.1, 0.2}}, {"latents_std", {1.0, 1.0}}};
  absl::StatusOr<AutoencoderKLConfig> c = AutoencoderKLConfig::FromJson(j, "c");
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("latents_mean"));
}

TEST(AutoencoderKLConfig, RejectsUnsupportedStructure) {
  nlohmann::json j = {{"block_out_channels", {32, 64}},
                      {"up_block_types", {"UpDecoderBlock2D", "AttnUpDecoderBlock2D"}},
                      {"act_fn", "gelu"},
                      {"norm_num_groups", 24}};
  absl::StatusOr<AutoencoderKLConfig> c = AutoencoderKLConfig::FromJson(j, "vae/config.json");
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  EXPECT_THAT(m, HasSubstr("vae/config.json"));
  EXPECT_THAT(m, HasSubstr("AttnUpDecoderBlock2D"));
  EXPECT_THAT(m, HasSubstr("gelu"));
  EXPECT_THAT(m, HasSubstr("not a positive multiple of norm_num_groups 24"));
}

TEST(AutoencoderKLConfig, SwishIsDiffusersOtherNameForSilu) {
  absl::StatusOr<AutoencoderKLConfig> c = AutoencoderKLConfig::FromJson({{"act_fn", "swish"}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();
}

TEST(AutoencoderKLConfig, ToJsonRoundTrips) {
  AutoencoderKLConfig c;
  c.latent_channels = 16;
  c.block_out_channels = {32, 64, 64};
  c.shift_factor = 0.1159;
  c.use_post_quant_conv = false;
  absl::StatusOr<AutoencoderKLConfig> back = AutoencoderKLConfig::FromJson(nlohmann::json::parse(c.ToJson()), "c");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->latent_channels, 16);
  EXPECT_EQ(back->block_out_channels, c.block_out_channels);
  EXPECT_DOUBLE_EQ(*back->shift_factor, 0.1159);
  EXPECT_FALSE(back->use_post_quant_conv);
}

TEST(AutoencoderKLConfig, RejectsMismatchedBlockLists) {
  nlohmann::json j = {{"block_out_channels", {32, 64}}, {"up_block_types", {"UpDecoderBlock2D"}}};
  EXPECT_FALSE(AutoencoderKLConfig::FromJson(j, "c").ok());
}

}  // namespace
}  // namespace vaedecode::families::autoencoder_kl
