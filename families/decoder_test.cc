#include "families/decoder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "device/counting_cpu_allocator.h"

namespace vaedecode::families {
namespace {

// A step's frames: [2, 3, n, 2, 3], every element `value` (one allocation).
at::Tensor StepFrames(int64_t n, float value) { return at::full({2, 3, n, 2, 3}, value); }

// ChunkFrames over steps returning `counts` frames: the concatenation of
// the steps, in order, whatever the counts.
void ExpectTheSteps(const std::vector<int64_t>& counts) {
  ChunkFrames frames(static_cast<int64_t>(counts.size()));
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < counts.size(); ++i) {
    want.push_back(StepFrames(counts[i], static_cast<float>(i + 1)));
    frames.Add(want.back().clone());
  }
  const at::Tensor got = frames.Take();
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_TRUE(got.equal(at::cat(want, 2))) << "steps " << at::IntArrayRef(counts);
}

TEST(ChunkFrames, IsTheStepsConcatenated) {
  ExpectTheSteps({1});
  ExpectTheSteps({4, 4});
  ExpectTheSteps({1, 4, 4, 4, 4});  // a causal decoder's clip: the sized path
  ExpectTheSteps({4, 4, 4});
  ExpectTheSteps({1, 4, 4, 2});     // a step returning fewer: what was filled, then it
  ExpectTheSteps({1, 4, 5, 4});     // one returning more: concatenated after
  ExpectTheSteps({1, 4, 0, 4, 4});  // none
}

// Frames that fill the output alone and own their buffer are the output
// (no copy); a view of a larger buffer is copied, so the output does not
// keep that buffer alive; a short fill is copied out.
TEST(FrameOutput, KeepsAnOwnedFillAndCopiesViews) {
  const at::Tensor whole = StepFrames(4, 1);
  FrameOutput owned(4);
  EXPECT_EQ(owned.Add(whole), 4);
  EXPECT_TRUE(owned.full());
  EXPECT_EQ(owned.Take().data_ptr(), whole.data_ptr());

  const at::Tensor larger = at::arange(2 * 3 * 6 * 2 * 3, at::kFloat).view({2, 3, 6, 2, 3});
  FrameOutput viewed(4);
  EXPECT_EQ(viewed.Add(larger), 4);  // the first 4 of 6
  const at::Tensor got = viewed.Take();
  EXPECT_NE(got.data_ptr(), larger.data_ptr());
  EXPECT_TRUE(got.equal(larger.narrow(2, 0, 4)));

  FrameOutput short_fill(5);
  EXPECT_EQ(short_fill.Add(larger.narrow(2, 1, 3)), 3);
  EXPECT_FALSE(short_fill.full());
  const at::Tensor filled = short_fill.Take();
  EXPECT_EQ(filled.size(2), 3);
  EXPECT_EQ(static_cast<int64_t>(filled.storage().nbytes()), static_cast<int64_t>(filled.nbytes()));
  EXPECT_TRUE(filled.equal(larger.narrow(2, 1, 3)));
}

// A whole clip's steps are not held twice: once the second step says the
// rest's frames, the chunk lives in one tensor the steps are copied into.
// Before, the steps were kept and concatenated at the end (2x the clip).
TEST(ChunkFrames, HoldsTheClipOnceAndTwoStepsMore) {
  device::CountingCpuAllocator& memory = device::CountingCpuAllocator::Install();
  const std::vector<int64_t> counts = {1, 4, 4, 4, 4};  // 17 frames
  const int64_t frame_bytes = 2 * 3 * 2 * 3 * sizeof(float);
  at::Tensor got;
  const int64_t before = memory.current_bytes();
  memory.ResetPeak();
  {
    ChunkFrames frames(static_cast<int64_t>(counts.size()));
    for (size_t i = 0; i < counts.size(); ++i) frames.Add(StepFrames(counts[i], static_cast<float>(i)));
    got = frames.Take();
  }
  EXPECT_EQ(got.size(2), 17);
  // The clip (17), and the first two steps (1 + 4) until they are copied in.
  EXPECT_EQ(memory.peak_bytes() - before, (17 + 1 + 4) * frame_bytes);
  EXPECT_EQ(memory.current_bytes() - before, 17 * frame_bytes);
}

}  // namespace
}  // namespace vaedecode::families
