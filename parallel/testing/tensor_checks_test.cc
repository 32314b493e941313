#include "parallel/testing/tensor_checks.h"

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace vaedecode::parallel::testing {
namespace {

TEST(TensorChecksTest, Equal) {
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  EXPECT_TRUE(ExpectTensorEqual(a, a.clone(), "same").ok());
  at::Tensor b = a.clone();
  b[1][2] = 42;
  const absl::Status s = ExpectTensorEqual(b, a, "changed");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("changed: differs at [1, 2]: 42 vs expected 5"), absl::string_view::npos) << s;
  EXPECT_FALSE(ExpectTensorEqual(a.reshape({3, 2}), a, "shape").ok());
  EXPECT_FALSE(ExpectTensorEqual(a.to(at::kDouble), a, "dtype").ok());
  EXPECT_FALSE(ExpectTensorEqual(at::Tensor(), a, "undefined").ok());
  const at::Tensor nan = at::full({2}, NAN);
  EXPECT_TRUE(ExpectTensorEqual(nan, nan.clone(), "nan").ok());
}

TEST(TensorChecksTest, Close) {
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  EXPECT_TRUE(ExpectTensorClose(a + 1e-6, a, 1e-5, 0, "close").ok());
  const absl::Status s = ExpectTensorClose(a + 1e-3, a, 1e-5, 0, "far");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("6 of 6 elements off"), absl::string_view::npos) << s;
  EXPECT_TRUE(ExpectTensorClose(a * 1.001, a, 0, 2e-3, "relative").ok());
  EXPECT_FALSE(ExpectTensorClose(at::full({2}, NAN), at::zeros({2}), 1, 1, "nan").ok());
}

}  // namespace
}  // namespace vaedecode::parallel::testing
