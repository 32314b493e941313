#include "families/nn/modules.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "device/counting_cpu_allocator.h"

namespace vaedecode::families::nn {
namespace {

TEST(UpsampleNearest, Bfloat16GivesTheFloat32RoutesValuesWithoutAFloat32Copy) {
  device::CountingCpuAllocator& memory = device::CountingCpuAllocator::Install();
  at::manual_seed(1);
  const at::Tensor image = at::randn({2, 8, 64, 48}).to(at::kBFloat16);
  const at::Tensor video = at::randn({1, 8, 3, 32, 24}).to(at::kBFloat16);
  // diffusers' route: through float32 and back (nearest copies values).
  const at::Tensor image_want = at::upsample_nearest2d(image.to(at::kFloat), {128, 96}).to(at::kBFloat16);
  const at::Tensor video_want = at::upsample_nearest3d(video.to(at::kFloat), {6, 64, 48}).to(at::kBFloat16);

  memory.ResetPeak();
  const int64_t base = memory.current_bytes();
  const at::Tensor image_got = UpsampleNearest(image, 1, 2);
  // The output and a few KiB of the kernel's own: no float32 copy of the
  // input (192 KiB here) or of the output (768 KiB).
  EXPECT_LE(memory.peak_bytes() - base, image_got.nbytes() + (16 << 10));
  EXPECT_EQ(image_got.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(image_got.equal(image_want));
  EXPECT_TRUE(image_got.is_contiguous());
  EXPECT_TRUE(UpsampleNearest(video, 2, 2).equal(video_want));
  EXPECT_THROW(UpsampleNearest(image, 2, 2), c10::Error);
}

}  // namespace
TEST(Patchify, IsUnpatchifysInverseWithDiffusersChannelOrder) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 3, 2, 6, 4});
  const at::Tensor p = Patchify(x, 2);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{2, 12, 2, 3, 2}));
  EXPECT_TRUE(at::equal(Unpatchify(p, 2), x));
  // Channel c·4 + dx·2 + dy holds pixel (2y + dy, 2x + dx) of channel c.
  EXPECT_TRUE(at::equal(p.select(1, 1 * 4 + 1 * 2 + 0), x.select(1, 1).slice(2, 0, 6, 2).slice(3, 1, 4, 2)));
  EXPECT_TRUE(at::equal(Patchify(x, 1), x));
}

TEST(SubpixelMajorSpaceToDepth, IsDepthToSpacesInverseWithSubpixelMajorChannels) {
  const at::Tensor image = at::arange(2 * 3 * 4 * 6, at::kFloat).reshape({2, 3, 4, 6});
  const at::Tensor packed = SubpixelMajorSpaceToDepth(image, 1, 2, 2);  // [2, 12, 2, 3]
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{2, 12, 2, 3}));
  // Channel (dy·2 + dx)·C + c holds pixel (2y + dy, 2x + dx) of channel c.
  EXPECT_TRUE(at::equal(packed.select(1, (1 * 2 + 0) * 3 + 2), image.select(1, 2).slice(1, 1, 4, 2).slice(2, 0, 6, 2)));
  EXPECT_TRUE(at::equal(SubpixelMajorDepthToSpace(packed, 1, 2, 2), image));
  const at::Tensor clip = at::arange(1 * 2 * 4 * 4 * 2, at::kFloat).reshape({1, 2, 4, 4, 2});
  const at::Tensor packed_clip = SubpixelMajorSpaceToDepth(clip, 2, 2, 2);  // [1, 16, 2, 2, 1]
  ASSERT_EQ(packed_clip.sizes(), (std::vector<int64_t>{1, 16, 2, 2, 1}));
  // Channel ((dt·2 + dy)·2 + dx)·C + c holds (2t + dt, 2y + dy, 2x + dx).
  EXPECT_EQ(packed_clip[0][((1 * 2 + 1) * 2 + 1) * 2 + 1][1][0][0].item<float>(), clip[0][1][3][1][1].item<float>());
  EXPECT_TRUE(at::equal(SubpixelMajorDepthToSpace(packed_clip, 2, 2, 2), clip));
}

TEST(ChannelGroupMean, AveragesConsecutiveChannels) {
  const at::Tensor x = at::arange(6, at::kFloat).reshape({1, 6, 1, 1});
  const at::Tensor m = ChannelGroupMean(x, 2);  // channels {0,1,2} and {3,4,5}
  EXPECT_TRUE(at::equal(m.flatten(), at::tensor({1.0f, 4.0f})));
}

}  // namespace vaedecode::families::nn
