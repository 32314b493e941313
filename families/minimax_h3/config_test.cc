#include "families/minimax_h3/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families::minimax_h3 {
namespace {

using ::testing::HasSubstr;

TEST(MiniMaxH3Config, EmptyConfigIsTheReleasedModel) {
  absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->patch_size(), 16);
  EXPECT_EQ(c->patch_size_t(), 4);
  EXPECT_EQ(c->dim(), 2048);
  EXPECT_EQ(c->rope_dim(), 48);
  EXPECT_EQ(c->ffn_inner_dim(), 8192);
  // The window geometry of AutoencoderKLMiniMaxH3.__init__ for clip_length 17, token_drop 3.
  EXPECT_EQ(c->frame_pre_padding(), 3);
  EXPECT_EQ(c->tokens_chunk_size(), 5);
  EXPECT_EQ(c->token_overlap(), 2);
  EXPECT_EQ(c->frame_overlap(), 5);
  EXPECT_EQ(c->window_latent_frames(), 7);
  EXPECT_EQ(c->latents_mean, std::vector<double>(24, 0.0));
  EXPECT_EQ(c->latents_std, std::vector<double>(24, 1.0));
}

TEST(MiniMaxH3Config, OutputFramesFollowDiffusersWindows) {
  const MiniMaxH3Config c;
  // Measured with diffusers (fixtures README): T = 3..8 -> 9, 13, 17, 18, 22, 26; T = 9 -> 30.
  const std::vector<std::pair<int64_t, int64_t>> frames = {{3, 9},  {4, 13}, {5, 17}, {6, 18},
                                                           {7, 22}, {8, 26}, {9, 30}};
  for (const auto& [t, want] : frames) EXPECT_EQ(c.Windows(t).output_frames, want) << t << " latent frames";
  // The pipeline's own lengths, 5n + 2 latent frames -> 17n + 5 frames, need no pad.
  for (int64_t n = 1; n <= 4; ++n) {
    const WindowPlan p = c.Windows(5 * n + 2);
    EXPECT_EQ(p.pad_frames, 0);
    EXPECT_EQ(p.windows, n);
    EXPECT_EQ(p.output_frames, 17 * n + 5);
  }
  // T = 9: 3 pad frames (latent indices 9, 10, 11), of which index 10 starts a chunk: 4 + 1 + 4 cut.
  EXPECT_EQ(c.Windows(9).pad_frames, 3);
  EXPECT_EQ(c.Windows(9).windows, 2);
  EXPECT_EQ(c.Windows(9).trim_frames, 9);
  // T <= 2: no window (diffusers fails on an empty torch.cat).
  EXPECT_EQ(c.Windows(2).windows, 0);
  EXPECT_EQ(c.Windows(1).windows, 0);
}

TEST(MiniMaxH3Config, WithoutTokenDropWindowsDoNotOverlap) {
  absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson({{"token_drop", 0}}, "c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token_overlap(), 0);
  EXPECT_EQ(c->frame_overlap(), 0);
  // 10 latent frames: two windows of 5, each 20 frames less its 3 pre-padding ones.
  const WindowPlan p = c->Windows(10);
  EXPECT_EQ(p.windows, 2);
  EXPECT_EQ(p.output_frames, 34);
  EXPECT_EQ(c->Windows(1).windows, 1);  // one latent frame + 4 pad copies, one window
  // 17 frames, less 4 for each pad copy (none starts a chunk): 1.
  EXPECT_EQ(c->Windows(1).output_frames, 1);
}

TEST(MiniMaxH3Config, BadRopeAndStatisticsAreRefused) {
  EXPECT_THAT(MiniMaxH3Config::FromJson({{"decoder_rope_dim_ratio", 0.5}, {"decoder_attention_head_dim", 20}}, "c")
                  .status()
                  .message(),
              HasSubstr("multiple of 6"));
  EXPECT_THAT(MiniMaxH3Config::FromJson({{"latents_mean", {0.0, 1.0}}}, "cfg.json").status().message(),
              HasSubstr("need 24 entries, have 2 and 24"));
  EXPECT_FALSE(MiniMaxH3Config::FromJson({{"decoder_num_attention_heads", 0}}, "c").ok());
}

TEST(MiniMaxH3Config, EncodersDiffusersCannotRunAreRefusedWithTheReason) {
  absl::StatusOr<MiniMaxH3Config> released = MiniMaxH3Config::FromJson(nlohmann::json::object(), "c");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_TRUE(released->CheckEncoder().ok()) << released->CheckEncoder();
  EXPECT_EQ(released->encoder_padding, PaddingMode::kReflect);
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {{{"block_out_channels", {128, 256, 250}}}, "block width 250 is not a positive multiple of norm_num_groups"},
      {{{"block_out_channels", nlohmann::json::array()}}, "\"block_out_channels\" is empty"},
      {{{"spatial_downsample_factors", {2, 2}}}, "fewer entries than the 6 levels"},
      {{{"spatial_padding_mode", "circular"}}, "\"circular\" is not supported"},
      {{{"norm_num_groups", 0}}, "norm_num_groups must be positive"},
  };
  for (const auto& [change, why] : bad) {
    absl::StatusOr<MiniMaxH3Config> c = MiniMaxH3Config::FromJson(change, "c");
    if (!c.ok()) {
      ADD_FAILURE() << change.dump() << ": the decoder does not read it: " << c.status();
      continue;
    }
    EXPECT_EQ(c->CheckEncoder().code(), absl::StatusCode::kFailedPrecondition) << change.dump();
    EXPECT_THAT(std::string(c->CheckEncoder().message()), ::testing::HasSubstr(why)) << change.dump();
  }
}

}  // namespace
}  // namespace vaedecode::families::minimax_h3
