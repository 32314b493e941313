#include "device/compute_device.h"

#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
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
    EXPECT_TRUE(absl::StrContains(status.message(), "this build has no CUDA backend")) << status;
  } else {
    EXPECT_TRUE(absl::StrContains(status.message(), "GPU(s)")) << status;
  }
}

TEST(ComputeDeviceTest, CudaTurnsTf32Off) {
  // "[gpu]": gpu_check.sh fails a binary that skips so where a GPU is.
  if (!at::hasCUDA()) GTEST_SKIP() << "[gpu] needs a CUDA LibTorch (libtorch_cuda linked) and a GPU";
  if (c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount() == 0) GTEST_SKIP() << "[gpu] no GPU visible";
  at::Context& context = at::globalContext();
  for (at::Float32Op op : {at::Float32Op::CONV, at::Float32Op::MATMUL}) {
    context.setFloat32Precision(at::Float32Backend::CUDA, op, at::Float32Precision::TF32);
  }
  ASSERT_TRUE(PrepareComputeDevice(c10::Device(c10::kCUDA, 0)).ok());
  EXPECT_EQ(context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV), at::Float32Precision::IEEE);
  EXPECT_EQ(context.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL), at::Float32Precision::IEEE);
  // What cuDNN convolutions and cuBLAS matmuls ask (the latter also checks
  // that the legacy and new settings agree).
  EXPECT_FALSE(context.allowTF32CuDNN(at::Float32Op::CONV));
  EXPECT_FALSE(context.allowTF32CuBLAS());
}

}  // namespace
}  // namespace vaedecode::device
