#include "families/flux2/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::flux2 {
namespace {

using ::testing::HasSubstr;

TEST(Flux2Config, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<Flux2Config> c = Flux2Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->latent_channels(), 32);
  EXPECT_EQ(c->patched_channels(), 128);
  EXPECT_EQ(c->decoder.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c->decoder.layers_per_block, 2);
  EXPECT_EQ(c->decoder.norm_num_groups, 32);
  EXPECT_TRUE(c->decoder.use_post_quant_conv);
  EXPECT_TRUE(c->decoder.mid_block_add_attention);
  EXPECT_DOUBLE_EQ(c->batch_norm_eps, 1e-4);
  EXPECT_DOUBLE_EQ(c->decoder.scaling_factor, 1.0);
  EXPECT_FALSE(c->decoder.shift_factor.has_value());
  EXPECT_EQ(c->decoder.spatial_factor(), 8);
  EXPECT_EQ(c->decoder.sample_size, 1024);
}

TEST(Flux2Config, DecoderWidthsComeFromDecoderBlockOutChannelsWhenSet) {
  nlohmann::json j = {{"block_out_channels", {16, 16, 32, 32}},
                      {"decoder_block_out_channels", {8, 16, 24, 24}},
                      {"norm_num_groups", 8},
                      {"batch_norm_eps", 1e-3}};
  absl::StatusOr<Flux2Config> c = Flux2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder.block_out_channels, (std::vector<int64_t>{8, 16, 24, 24}));
  EXPECT_DOUBLE_EQ(c->batch_norm_eps, 1e-3);

  j["decoder_block_out_channels"] = nullptr;  // diffusers: "or block_out_channels"
  c = Flux2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder.block_out_channels, (std::vector<int64_t>{16, 16, 32, 32}));
}

TEST(Flux2Config, RejectsPatchesThePipelineCannotUnpack) {
  absl::StatusOr<Flux2Config> c = Flux2Config::FromJson({{"patch_size", {4, 4}}}, "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"patch_size\" [4, 4] is not supported"));
}

TEST(Flux2Config, DecoderWidthsAreValidatedAsAutoencoderKLs) {
  absl::StatusOr<Flux2Config> c =
      Flux2Config::FromJson({{"decoder_block_out_channels", {8, 12}}, {"norm_num_groups", 8}}, "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("block width 12 is not a positive multiple"));
}

TEST(Flux2Config, JsonRoundTrips) {
  nlohmann::json j = {{"decoder_block_out_channels", {8, 16}}, {"norm_num_groups", 4}, {"latent_channels", 8}};
  absl::StatusOr<Flux2Config> c = Flux2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Flux2Config> again = Flux2Config::FromJson(nlohmann::json::parse(c->ToJson()), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->decoder.block_out_channels, c->decoder.block_out_channels);
  EXPECT_EQ(again->latent_channels(), 8);
  EXPECT_EQ(nlohmann::json::parse(again->ToJson())["_class_name"], "AutoencoderKLFlux2");
}

}  // namespace
}  // namespace vaedecode::families::flux2
