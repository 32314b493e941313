#pragma once

// Tensor comparisons that return a Status instead of asserting, for test
// bodies that run in RunRanks children (where gtest assertions are lost).

#include <string_view>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"

namespace vaedecode::parallel::testing {

// Same shape, same dtype and bit-identical values (NaNs equal to NaNs).
absl::Status ExpectTensorEqual(const at::Tensor& actual, const at::Tensor& expected, std::string_view what);

// Same shape and dtype, |actual - expected| <= atol + rtol * |expected|
// everywhere (compared in float64). The error gives the largest absolute
// error and where it is.
absl::Status ExpectTensorClose(const at::Tensor& actual, const at::Tensor& expected, double atol, double rtol,
                               std::string_view what);

// max |actual - expected| and the root of the mean squared difference, in
// float64 on the CPU whatever device either tensor is on (a decode on a GPU
// against a reference read from a file). Same shapes (broadcasting aside).
double MaxAbsError(const at::Tensor& actual, const at::Tensor& expected);
double RootMeanSquareError(const at::Tensor& actual, const at::Tensor& expected);

}  // namespace vaedecode::parallel::testing
