#include "parallel/testing/tensor_checks.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel::testing {
namespace {

absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

std::string Shape(const at::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes().vec(), ", "), "]"); }

absl::Status CheckLayout(const at::Tensor& actual, const at::Tensor& expected, std::string_view what) {
  if (!actual.defined() || !expected.defined()) {
    return absl::InternalError(
        absl::StrCat(AsAbsl(what), ": ", actual.defined() ? "expected" : "actual", " tensor is undefined"));
  }
  if (actual.sizes() != expected.sizes()) {
    return absl::InternalError(absl::StrCat(AsAbsl(what), ": shape ", Shape(actual), ", expected ", Shape(expected)));
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return absl::InternalError(absl::StrCat(AsAbsl(what), ": dtype ", c10::toString(actual.scalar_type()),
                                            ", expected ", c10::toString(expected.scalar_type())));
  }
  return absl::OkStatus();
}

std::string Index(int64_t flat, const at::Tensor& t) {
  std::vector<int64_t> index(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    index[d] = flat % t.size(d);
    flat /= t.size(d);
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

}  // namespace

absl::Status ExpectTensorEqual(const at::Tensor& actual, const at::Tensor& expected, std::string_view what) {
  RETURN_IF_ERROR(CheckLayout(actual, expected, what));
  if (actual.numel() == 0) return absl::OkStatus();
  const at::Tensor a = actual.cpu().contiguous();
  const at::Tensor e = expected.cpu().contiguous();
  at::Tensor same = a.eq(e);
  if (a.is_floating_point()) same = same.logical_or(a.isnan().logical_and(e.isnan()));
  if (same.all().item<bool>()) return absl::OkStatus();
  const int64_t first = same.logical_not().reshape({-1}).nonzero()[0][0].item<int64_t>();
  const at::Tensor af = a.reshape({-1}).to(at::kDouble);
  const at::Tensor ef = e.reshape({-1}).to(at::kDouble);
  return absl::InternalError(absl::StrCat(AsAbsl(what), ": differs at ", Index(first, a), ": ",
                                          af[first].item<double>(), " vs expected ", ef[first].item<double>(), " (",
                                          same.logical_not().sum().item<int64_t>(), " of ", a.numel(),
                                          " elements differ)"));
}

absl::Status ExpectTensorClose(const at::Tensor& actual, const at::Tensor& expected, double atol, double rtol,
                               std::string_view what) {
  RETURN_IF_ERROR(CheckLayout(actual, expected, what));
  if (actual.numel() == 0) return absl::OkStatus();
  const at::Tensor a = actual.cpu().to(at::kDouble).reshape({-1});
  const at::Tensor e = expected.cpu().to(at::kDouble).reshape({-1});
  const at::Tensor error = (a - e).abs();
  const at::Tensor allowed = e.abs() * rtol + atol;
  const at::Tensor bad = error.gt(allowed).logical_or(error.isnan());
  const int64_t worst = error.nan_to_num(INFINITY).argmax().item<int64_t>();
  if (!bad.any().item<bool>()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(AsAbsl(what), ": ", bad.sum().item<int64_t>(), " of ", a.numel(),
                                          " elements off; max abs error ", error[worst].item<double>(), " at ",
                                          Index(worst, actual), " (", a[worst].item<double>(), " vs expected ",
                                          e[worst].item<double>(), "; atol=", atol, " rtol=", rtol, ")"));
}

double MaxAbsError(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual.cpu().to(at::kDouble) - expected.cpu().to(at::kDouble)).abs().max().item<double>();
}

double RootMeanSquareError(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual.cpu().to(at::kDouble) - expected.cpu().to(at::kDouble)).square().mean().sqrt().item<double>();
}

}  // namespace vaedecode::parallel::testing
