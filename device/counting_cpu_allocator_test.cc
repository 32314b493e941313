#include "device/counting_cpu_allocator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace vaedecode::device {
namespace {

TEST(CountingCpuAllocator, CountsLiveAndPeakBytes) {
  CountingCpuAllocator& a = CountingCpuAllocator::Install();
  const int64_t base = a.current_bytes();
  a.ResetPeak();
  {
    at::Tensor x = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    EXPECT_EQ(a.current_bytes() - base, 4 << 20);
    {
      at::Tensor y = at::empty({1 << 19}, at::kDouble);  // 4 MiB more
      EXPECT_EQ(a.current_bytes() - base, 8 << 20);
    }
    EXPECT_EQ(a.current_bytes() - base, 4 << 20);
  }
  EXPECT_EQ(a.current_bytes(), base);
  EXPECT_GE(a.peak_bytes() - base, 8 << 20);
  a.ResetPeak();
  EXPECT_EQ(a.peak_bytes(), a.current_bytes());
}

TEST(CountingCpuAllocator, ABudgetFailsAllocationsLikeOutOfMemory) {
  CountingCpuAllocator& a = CountingCpuAllocator::Install();
  a.set_limit_bytes(a.current_bytes() + (8 << 20));
  at::Tensor fits = at::empty({1 << 20}, at::kFloat);  // 4 MiB
  try {
    at::Tensor too_much = at::empty({2 << 20}, at::kFloat);  // 8 MiB more
    ADD_FAILURE() << "allocation above the budget succeeded";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  a.set_limit_bytes(0);
  at::Tensor now_fine = at::empty({2 << 20}, at::kFloat);
  EXPECT_EQ(now_fine.numel(), 2 << 20);
}

TEST(CountingCpuAllocator, TensorsStillWork) {
  CountingCpuAllocator::Install();
  at::Tensor x = at::arange(10, at::kFloat);
  EXPECT_EQ(x.sum().item<float>(), 45.0f);
  at::Tensor y = x.clone().mul_(2);
  EXPECT_EQ(y[9].item<float>(), 18.0f);
}

}  // namespace
}  // namespace vaedecode::device
