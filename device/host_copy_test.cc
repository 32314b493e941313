#include "device/host_copy.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

namespace vaedecode::device {
namespace {

TEST(HostCopyTest, ACpuTensorIsItsOwnCopyAndReady) {
  const at::Tensor t = at::arange(5, at::kFloat);
  HostCopy copy = HostCopy::Start(t);
  EXPECT_TRUE(copy.ready());
  EXPECT_TRUE(copy.Wait().is_same(t));  // no copy made on a CPU
  HostCopy moved = std::move(copy);
  EXPECT_TRUE(moved.Wait().equal(t));
  EXPECT_FALSE(HostCopy().Wait().defined());
}

// On a GPU (the --config=gpu build where one is): the copy lands in pinned
// memory with the tensor's values once waited on.
TEST(HostCopyTest, AGpuTensorArrivesInPinnedMemory) {
  if (!at::hasCUDA() || c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount() == 0) {
    GTEST_SKIP() << "[gpu] no GPU visible";
  }
  const at::Tensor t = at::arange(1 << 20, at::TensorOptions().device(at::kCUDA)).to(at::kFloat);
  HostCopy copy = HostCopy::Start(t * 2);
  const at::Tensor& host = copy.Wait();
  EXPECT_TRUE(copy.ready());
  EXPECT_TRUE(host.is_cpu());
  EXPECT_TRUE(host.is_pinned());
  EXPECT_TRUE(host.equal(at::arange(1 << 20, at::kFloat) * 2));
}

}  // namespace
}  // namespace vaedecode::device
