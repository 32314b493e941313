#include "device/device_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace vaedecode::device {
namespace {

// Runs first (gtest keeps declaration order): nothing is installed yet.
TEST(DeviceMemoryTest, CudaAccountingNeedsTheGpuBuild) {
  ASSERT_EQ(ProcessDeviceMemory(), nullptr);
#if defined(VAEDECODE_TORCH_CUDA)
  // Before installing anything: on a machine with a GPU the install would
  // succeed, and the next test's CPU install be refused (one per process).
  GTEST_SKIP() << "a --config=gpu build: exercised by //tests/gpu";
#endif
  absl::StatusOr<DeviceMemory*> cuda = InstallDeviceMemory(c10::Device(c10::kCUDA, 0));
  ASSERT_EQ(cuda.status().code(), absl::StatusCode::kUnimplemented) << cuda.status();
  EXPECT_TRUE(absl::StrContains(cuda.status().message(), "--config=gpu")) << cuda.status();
  EXPECT_EQ(ProcessDeviceMemory(), nullptr);
}

TEST(DeviceMemoryTest, CpuCountsLiveAndPeakBytesAndEnforcesTheBudget) {
  absl::StatusOr<DeviceMemory*> installed = InstallDeviceMemory(c10::Device(c10::kCPU));
  ASSERT_TRUE(installed.ok()) << installed.status();
  DeviceMemory& memory = **installed;
  EXPECT_EQ(ProcessDeviceMemory(), &memory);
  EXPECT_EQ(InstallDeviceMemory(c10::Device(c10::kCPU)).value(), &memory);
  EXPECT_EQ(memory.backend(), "cpu");
  EXPECT_EQ(memory.free_bytes(), -1);  // no budget: unbounded

  const int64_t base = memory.current_bytes();
  memory.ResetPeak();
  {
    at::Tensor a = at::empty({4 << 20}, at::kByte);
    EXPECT_EQ(memory.current_bytes(), base + (4 << 20));
  }
  EXPECT_EQ(memory.current_bytes(), base);
  EXPECT_EQ(memory.peak_bytes(), base + (4 << 20));

  ASSERT_TRUE(memory.SetBudget(base + (8 << 20)).ok());
  EXPECT_EQ(memory.budget_bytes(), base + (8 << 20));
  EXPECT_EQ(memory.free_bytes(), 8 << 20);
  at::Tensor fits = at::empty({6 << 20}, at::kByte);
  EXPECT_EQ(memory.free_bytes(), 2 << 20);
  try {
    at::Tensor too_big = at::empty({4 << 20}, at::kByte);
    ADD_FAILURE() << "an allocation above the budget succeeded";
  } catch (const c10::Error& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "out of memory")) << e.what();
  }
  EXPECT_EQ(memory.SetBudget(-1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(memory.SetBudget(0).ok());
  EXPECT_EQ(memory.free_bytes(), -1);

  // One device per process: a different kind is refused.
  EXPECT_EQ(InstallDeviceMemory(c10::Device(c10::kCUDA, 0)).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace vaedecode::device
