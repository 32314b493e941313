#include "families/ltx2/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::ltx2 {
namespace {

using ::testing::HasSubstr;

// The ltx2 fixture's decoder arguments.
nlohmann::json FixtureLike() {
  return {{"_class_name", "AutoencoderKLLTX2Video"},
          {"decoder_block_out_channels", {8, 16, 32}},
          {"decoder_layers_per_block", {2, 2, 2, 1}},
          {"decoder_causal", false},
          {"decoder_inject_noise", {false, false, false, false}},
          {"decoder_spatial_padding_mode", "reflect"},
          {"decoder_spatio_temporal_scaling", {true, true, true}},
          {"upsample_factor", {2, 2, 2}},
          {"upsample_residual", {true, true, true}},
          {"upsample_type", {"spatiotemporal", "spatiotemporal", "spatiotemporal"}},
          {"latent_channels", 128},
          {"patch_size", 4},
          {"patch_size_t", 1},
          {"timestep_conditioning", false}};
}

TEST(LTX2Config, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->latent_channels, 128);
  EXPECT_EQ(c->decoder_block_out_channels, (std::vector<int64_t>{256, 512, 1024}));
  EXPECT_TRUE(c->decoder_causal);
  EXPECT_EQ(c->spatial_padding, PaddingMode::kReflect);
  EXPECT_EQ(c->spatial_factor(), 32);
  EXPECT_EQ(c->temporal_factor(), 8);
  EXPECT_EQ(c->mid_channels(), 1024);
  EXPECT_EQ(c->mid_layers(), 5);
}

TEST(LTX2Config, DecoderListsAreReversedAsDiffusersDoes) {
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(FixtureLike(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mid_channels(), 32);
  EXPECT_EQ(c->mid_layers(), 1);
  const std::vector<UpBlockSpec> ups = c->UpBlocks();
  ASSERT_EQ(ups.size(), 3u);
  // Widths (32, 16, 8) halved by upsample_factor 2: 16, 8, 4; no conv_in.
  EXPECT_EQ(ups[0].in_channels, 16);
  EXPECT_EQ(ups[0].out_channels, 16);
  EXPECT_EQ(ups[2].out_channels, 4);
  EXPECT_EQ(ups[1].num_layers, 2);
  EXPECT_EQ(ups[0].stride, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(c->final_channels(), 4);
  EXPECT_EQ(c->spatial_factor(), 32);
  EXPECT_EQ(c->temporal_factor(), 8);
}

TEST(LTX2Config, UpsampleTypeIsNotReversed) {
  nlohmann::json j = FixtureLike();
  j["upsample_type"] = {"spatial", "temporal", "spatiotemporal"};
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->UpBlocks()[0].stride, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(c->UpBlocks()[1].stride, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(c->spatial_factor(), 4 * 2 * 1 * 2);
  EXPECT_EQ(c->temporal_factor(), 1 * 2 * 2);
}

TEST(LTX2Config, BoolsBroadcastLikeDiffusers) {
  nlohmann::json j = FixtureLike();
  j["decoder_spatio_temporal_scaling"] = false;
  j["upsample_residual"] = false;
  j["decoder_inject_noise"] = false;
  j["upsample_factor"] = {1, 1, 1};  // without upsamplers the widths chain through conv_in resnets
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoder_spatio_temporal_scaling, std::vector<bool>(3, false));
  EXPECT_EQ(c->decoder_inject_noise, std::vector<bool>(4, false));
  EXPECT_EQ(c->spatial_factor(), 4);
  EXPECT_EQ(c->temporal_factor(), 1);
}

TEST(LTX2Config, RefusesNoiseInjection) {
  nlohmann::json j = FixtureLike();
  j["decoder_inject_noise"] = {false, true, false, false};
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("decoder_inject_noise is not supported"));
  j["decoder_inject_noise"] = true;
  EXPECT_FALSE(LTX2Config::FromJson(j, "cfg.json").ok());
}

TEST(LTX2Config, PaddingModes) {
  nlohmann::json j = FixtureLike();
  j["decoder_spatial_padding_mode"] = "replicate";
  EXPECT_EQ(LTX2Config::FromJson(j, "c")->spatial_padding, PaddingMode::kReplicate);
  j["decoder_spatial_padding_mode"] = "zeros";
  EXPECT_EQ(LTX2Config::FromJson(j, "c")->spatial_padding, PaddingMode::kZeros);
  j["decoder_spatial_padding_mode"] = "circular";
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"circular\" is not supported"));
}

TEST(LTX2Config, RejectsWidthsThatDoNotChain) {
  nlohmann::json j = FixtureLike();
  j["decoder_spatio_temporal_scaling"] = {true, false, true};  // 16 channels reach resnets of 8
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("receives 16 channels but takes 8"));
}

TEST(LTX2Config, RejectsInconsistentLists) {
  nlohmann::json j = FixtureLike();
  j["upsample_factor"] = {2, 2};
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("\"upsample_factor\" has 2 entries, want 3"));
  j = FixtureLike();
  j["decoder_layers_per_block"] = {2, 2, 2};
  EXPECT_FALSE(LTX2Config::FromJson(j, "c").ok());
  j = FixtureLike();
  j["patch_size_t"] = 2;
  EXPECT_FALSE(LTX2Config::FromJson(j, "c").ok());
}

TEST(LTX2Config, TimestepConditioningWithAWideningUpBlockIsRefused) {
  nlohmann::json j = FixtureLike();
  j["timestep_conditioning"] = true;
  EXPECT_TRUE(LTX2Config::FromJson(j, "c").ok());
  j["upsample_factor"] = {1, 1, 1};  // widths 32 -> 16 -> 8: conv_in resnets
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("receives the raw timestep"));
}

TEST(LTX2Config, CompressionRatiosThatDisagreeWithTheStructureAreWarnedAbout) {
  // The released layout is 32x in space (8x + 4x4 unpatchify) and 8x in time.
  absl::StatusOr<LTX2Config> c =
      LTX2Config::FromJson({{"spatial_compression_ratio", 32}, {"temporal_compression_ratio", 8}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->structure_warnings.empty());
  // diffusers' decoder never reads them (pipelines size latents from them):
  // decoded as the blocks say, with a warning naming what they imply.
  c = LTX2Config::FromJson({{"spatial_compression_ratio", 16}}, "vae/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->structure_warnings.size(), 1u);
  EXPECT_THAT(c->structure_warnings[0],
              ::testing::HasSubstr("spatial_compression_ratio is 16 but the decoder's blocks upsample 32x"));
  EXPECT_EQ(c->spatial_factor(), 32);
}

TEST(LTX2Config, EncoderBlocksFollowDiffusersArithmetic) {
  // Diffusers' defaults: conv_in widens to latent_channels (128), each
  // folding downsampler to block_out_channels[i].
  absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->CheckEncoder().ok()) << c->CheckEncoder();
  const std::vector<DownBlockSpec> downs = c->DownBlocks();
  ASSERT_EQ(downs.size(), 4u);
  EXPECT_EQ(downs[0].in_channels, 128);
  EXPECT_EQ(downs[0].out_channels, 256);
  EXPECT_EQ(downs[0].stride, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(downs[1].stride, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(downs[3].num_layers, 2);
  EXPECT_EQ(c->encoder_mid_channels(), 2048);
  // A "conv" downsampler or none keeps the block's width.
  nlohmann::json j = {{"block_out_channels", {128, 64}},
                      {"layers_per_block", {1, 1, 1}},
                      {"downsample_type", {"conv", "spatial"}},
                      {"spatio_temporal_scaling", {true, false}}};
  c = LTX2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->CheckEncoder().message(),
              HasSubstr("down block 1 ends with 128 channels but the next layer takes 64"));
  j["spatio_temporal_scaling"] = true;  // broadcast to every block, as diffusers does
  c = LTX2Config::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->CheckEncoder().ok()) << c->CheckEncoder();
  EXPECT_EQ(c->DownBlocks()[0].out_channels, 128);
}

TEST(LTX2Config, EncodersDiffusersCannotRunAreRefusedWithTheReason) {
  struct Bad {
    nlohmann::json change;
    std::string why;
  };
  const std::vector<Bad> bad = {
      {{{"downsample_type", {"spatial", "temporal", "pooling", "spatiotemporal"}}}, "\"pooling\" is unknown"},
      {{{"down_block_types", {"LTX2VideoDownBlock3D", "DownBlock", "LTX2VideoDownBlock3D", "LTX2VideoDownBlock3D"}}},
       "\"DownBlock\" is unknown"},
      {{{"encoder_spatial_padding_mode", "circular"}}, "\"circular\" is not supported"},
      {{{"block_out_channels", {256, 512, 1024, 2050}}}, "cannot fold 1024 channels into 2050"},
      {{{"layers_per_block", {4, 6}}}, "\"layers_per_block\" has 2 entries for 4 down blocks"},
      {{{"spatio_temporal_scaling", {true, true}}}, "\"spatio_temporal_scaling\" has 2 entries"},
      {{{"in_channels", 0}}, "in_channels must be positive"},
  };
  for (const Bad& b : bad) {
    nlohmann::json j = nlohmann::json::object();
    j.update(b.change);
    absl::StatusOr<LTX2Config> c = LTX2Config::FromJson(j, "c");
    ASSERT_TRUE(c.ok()) << b.change.dump() << ": the decoder is unaffected: " << c.status();
    const absl::Status s = c->CheckEncoder();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << b.change.dump();
    EXPECT_THAT(s.message(), HasSubstr(b.why)) << b.change.dump();
  }
}

}  // namespace
}  // namespace vaedecode::families::ltx2
