#include "rpc/output_frames.h"

#include <gtest/gtest.h>

namespace vaedecode::rpc {
namespace {

TEST(OutputFramesTest, EmptyTableIsTheCausalFormula) {
  const OutputFrameTable causal;
  EXPECT_EQ(OutputFrames(causal, 4, 1), 1);
  EXPECT_EQ(OutputFrames(causal, 4, 3), 9);
  EXPECT_EQ(OutputFrames(causal, 8, 2), 9);
  EXPECT_EQ(OutputFrames(causal, 4, 0), 0);
}

TEST(OutputFramesTest, TableThenPeriod) {
  // MiniMax-H3's default windows (clip_length 17, token_drop 3): 5 latent
  // frames per window step, 17 more frames each.
  OutputFrameTable t;
  t.frames = {0, 0, 0, 9, 13, 17, 18, 22, 26, 30};
  t.period = 5;
  t.frames_per_period = 17;
  for (int64_t latent = 0; latent < 10; ++latent) EXPECT_EQ(OutputFrames(t, 4, latent), t.frames[latent]);
  EXPECT_EQ(OutputFrames(t, 4, 10), 34);
  EXPECT_EQ(OutputFrames(t, 4, 11), 35);
  EXPECT_EQ(OutputFrames(t, 4, 15), 51);
  EXPECT_EQ(OutputFrames(t, 4, 16), 52);
  EXPECT_EQ(OutputFrames(t, 4, 19), 64);
  EXPECT_EQ(OutputFrames(t, 4, 105), 357);  // F(5) + 20 periods
}

}  // namespace
}  // namespace vaedecode::rpc
