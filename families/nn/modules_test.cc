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

}  // namespace vaedecode::families::nn
