#include "families/minimax_h3_audio/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::minimax_h3_audio {
namespace {

using ::testing::HasSubstr;

TEST(MiniMaxH3AudioConfig, EmptyConfigTakesDiffusersDefaults) {
  absl::StatusOr<MiniMaxH3AudioConfig> c = MiniMaxH3AudioConfig::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hop(), 800);  // 40 latents a second at 32 kHz
  EXPECT_EQ(c->Samples(5), 4000);
  EXPECT_EQ(c->sampling_rate, 32000);
  EXPECT_EQ(c->resblock_dilation_sizes, (std::vector<std::vector<int64_t>>{{1, 3, 5}, {1, 3, 5}, {1, 3, 5}}));
  EXPECT_TRUE(c->unread_keys.empty());
}

TEST(MiniMaxH3AudioConfig, AnOddUpsamplerAddsASample) {
  // ConvTranspose1d(k 4, stride 3, padding 0): (L - 1)·3 + 4 = 3L + 1 samples.
  nlohmann::json j = {{"encoder_rates", {3}}, {"decoder_rates", {3}}, {"decoder_kernel_sizes", {4}}};
  absl::StatusOr<MiniMaxH3AudioConfig> c = MiniMaxH3AudioConfig::FromJson(j, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Samples(5), 16);
}

TEST(MiniMaxH3AudioConfig, RefusesWhatDiffusersCannotBuildOrRun) {
  auto message = [](const nlohmann::json& j) {
    return std::string(MiniMaxH3AudioConfig::FromJson(j, "c").status().message());
  };
  EXPECT_THAT(message({{"decoder_rates", {5, 5, 2, 2, 2, 2}}, {"decoder_kernel_sizes", {9, 9, 4, 4, 4, 4}}}),
              HasSubstr("must upsample by the encoder hop length 800, got 400"));
  EXPECT_THAT(message({{"latent_dim", 100}}), HasSubstr("must be a positive multiple of latent_channels"));
  EXPECT_THAT(message({{"resblock_kernel_sizes", {4}}, {"resblock_dilation_sizes", {{1}}}}),
              HasSubstr("kernel 4 is even, which changes the length"));
  EXPECT_THAT(message({{"resblock_dilation_sizes", {1, 3}}}), HasSubstr("a list of lists of integers"));
  EXPECT_THAT(message({{"latents_mean", {0.0, 1.0}}, {"latents_std", {1.0, 1.0}}}),
              HasSubstr("must have latent_channels (32) entries, got 2/2"));
}

}  // namespace
}  // namespace vaedecode::families::minimax_h3_audio
