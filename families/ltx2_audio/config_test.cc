#include "families/ltx2_audio/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::ltx2_audio {
namespace {

using ::testing::HasSubstr;

TEST(LTX2AudioConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<LTX2AudioConfig> c = LTX2AudioConfig::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->causality_axis, CausalityAxis::kHeight);
  EXPECT_FALSE(c->group_norm);
  EXPECT_EQ(c->mel_bins, 64);
  EXPECT_EQ(c->MelFrames(6), 21);  // 4L - 3
  EXPECT_EQ(c->MelFrames(1), 1);
  EXPECT_TRUE(c->unread_keys.empty());
}

TEST(LTX2AudioConfig, RefusesWhatDiffusersCannotBuild) {
  auto message = [](const nlohmann::json& j) {
    return std::string(LTX2AudioConfig::FromJson(j, "c").status().message());
  };
  EXPECT_THAT(message({{"causality_axis", nullptr}}), HasSubstr("\"causality_axis\" is null"));
  EXPECT_THAT(message({{"causality_axis", "depth"}}), HasSubstr("none, width, height or width-compatibility"));
  EXPECT_THAT(message({{"norm_type", "group"}}), HasSubstr("needs causality_axis \"none\""));
  EXPECT_THAT(message({{"norm_type", "group"}, {"causality_axis", "none"}, {"base_channels", 8}}),
              HasSubstr("not a multiple of 32 groups"));
  EXPECT_THAT(message({{"norm_type", "layer"}}), HasSubstr("\"group\" or \"pixel\""));
  // The encoder's first width is base_channels itself, normalised by 32 groups too.
  EXPECT_THAT(message({{"norm_type", "group"}, {"causality_axis", "none"}, {"base_channels", 48}, {"ch_mult", {2, 4}}}),
              HasSubstr("block width 48 is not a multiple of 32 groups"));
  EXPECT_THAT(message({{"ch_mult", {int64_t{1} << 40}}}), HasSubstr("must stay within"));
  EXPECT_THAT(message({{"mel_bins", 0}}), HasSubstr("\"mel_bins\" must be positive (or null)"));
  EXPECT_THAT(message({{"ch_mult", std::vector<int>{}}}), HasSubstr("\"ch_mult\" must be 1 to 16"));
  EXPECT_TRUE(LTX2AudioConfig::FromJson({{"mel_bins", nullptr}}, "c").ok());
  EXPECT_EQ(LTX2AudioConfig::FromJson({{"mel_bins", nullptr}}, "c")->mel_bins, 0);
}

TEST(LTX2VocoderConfig, DefaultsAreLTX2s) {
  absl::StatusOr<LTX2VocoderConfig> c = LTX2VocoderConfig::FromJson(nlohmann::json::object(), "v");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hop(), 240);  // 24 kHz from 100 mel frames a second
  EXPECT_EQ(c->Samples(21), 21 * 240);
  EXPECT_EQ(c->final_act_fn, "tanh");
  EXPECT_EQ(LTX2VocoderConfig::FromJson({{"final_act_fn", nullptr}}, "v")->final_act_fn, "");
}

TEST(LTX2VocoderConfig, RefusesWhatDiffusersCannotBuildOrBuildsWrong) {
  auto message = [](const nlohmann::json& j) {
    return std::string(LTX2VocoderConfig::FromJson(j, "v").status().message());
  };
  EXPECT_THAT(message({{"act_fn", "gelu"}}), HasSubstr("snakebeta, snake or leaky_relu"));
  EXPECT_THAT(message({{"antialias", true}}), HasSubstr("nested activations"));
  EXPECT_THAT(message({{"upsample_factors", {6, 5}}}), HasSubstr("has 5 entries for 2 upsample_factors"));
  EXPECT_THAT(message({{"resnet_dilations", {1, 3}}}), HasSubstr("a list of lists of integers"));
  EXPECT_THAT(message({{"upsample_kernel_sizes", {4, 15, 8, 4, 4}}}), HasSubstr("shorter than its factor 6"));
  EXPECT_THAT(message({{"hidden_channels", 16}}), HasSubstr("halvable by 5 upsamplers"));
  EXPECT_THAT(message({{"act_fn", "snake"}, {"antialias_kernel_size", 2}}), HasSubstr("no samples"));
  EXPECT_THAT(message({{"final_act_fn", "relu"}}), HasSubstr("tanh, clamp or null"));
}

}  // namespace
}  // namespace vaedecode::families::ltx2_audio
