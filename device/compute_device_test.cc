#include "device/compute_device.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace vaedecode::device {
namespace {

TEST(ComputeDeviceTest, ParsesWorkerDeviceNames) {
  EXPECT_EQ(ParseComputeDevice("cpu").value(), c10::Device(c10::kCPU));
  // cpu:N numbers CPU workers; LibTorch has a single CPU device.
  EXPECT_EQ(ParseComputeDevice("cpu:3").value(), c10::Device(c10::kCPU));
  EXPECT_EQ(ParseComputeDevice("cuda:0").value(), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(ParseComputeDevice("cuda:7").value(), c10::Device(c10::kCUDA, 7));
  for (const char* bad : {"", "cuda", "cuda:", "cuda:-1", "cuda:x", "gpu:0", "cpu:1:2", "cuda:99999"}) {
    absl::StatusOr<c10::Device> d = ParseComputeDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(d.status().message(), absl::StrCat("\"", bad, "\""))) << d.status();
  }
}

TEST(ComputeDeviceTest, CpuNeedsNothing) { EXPECT_TRUE(PrepareComputeDevice(c10::Device(c10::kCPU)).ok()); }

TEST(ComputeDeviceTest, CudaIsRefusedClearlyWhereItCannotRun) {
  const absl::Status status = PrepareComputeDevice(c10::Device(c10::kCUDA, 127));
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  if (!at::hasCUDA()) {
    EXPECT_TRUE(absl::StrContains(status.message(), "this LibTorch has no CUDA")) << status;
  } else {
    EXPECT_TRUE(absl::StrContains(status.message(), "GPU(s)")) << status;
  }
}

TEST(ComputeDeviceTest, CudaTurnsTf32Off) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA LibTorch and a GPU";
  at::globalContext().setAllowTF32CuBLAS(true);
  at::globalContext().setAllowTF32CuDNN(true);
  ASSERT_TRUE(PrepareComputeDevice(c10::Device(c10::kCUDA, 0)).ok());
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  EXPECT_FALSE(at::globalContext().allowTF32CuDNN());
}

}  // namespace
}  // namespace vaedecode::device
