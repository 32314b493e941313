#include "families/pixel_convention.h"

#include <ATen/ATen.h>

namespace vaedecode::families {
namespace {

// `values` shaped to broadcast over x's channels (dim 1), float32 on x's device.
at::Tensor PerChannel(const std::vector<double>& values, const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = static_cast<int64_t>(values.size());
  return at::tensor(values, at::kDouble).to(at::TensorOptions().dtype(at::kFloat).device(x.device())).view(shape);
}

}  // namespace

at::Tensor PixelConvention::FromSymmetric(const at::Tensor& x) const {
  if (symmetric()) return x;
  return ((x.to(at::kFloat) + 1) / 2 - PerChannel(mean, x)) / PerChannel(std, x);
}

at::Tensor PixelConvention::ToSymmetric(const at::Tensor& x) const {
  if (symmetric()) return x;
  return (x.to(at::kFloat) * PerChannel(std, x) + PerChannel(mean, x)) * 2 - 1;
}

}  // namespace vaedecode::families
