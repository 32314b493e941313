#include "families/flux2/blocks.h"

#include <utility>

#include <ATen/ATen.h>

namespace vaedecode::families::flux2 {

LatentBatchNormImpl::LatentBatchNormImpl(int64_t channels) {
  running_mean = register_buffer("running_mean", at::zeros({channels}));
  running_var = register_buffer("running_var", at::ones({channels}));
}

namespace {

// The pipeline's statistics for `z`: mean and std = sqrt(var + eps), viewed
// [1, C, 1, 1] in z's dtype on z's device.
std::pair<at::Tensor, at::Tensor> Statistics(const LatentBatchNormImpl& bn, const at::Tensor& z, double eps) {
  const int64_t c = bn.running_mean.size(0);
  TORCH_CHECK(z.dim() == 4 && z.size(1) == c, "the FLUX.2 latent BatchNorm expects [B, ", c, ", h, w], got ",
              z.sizes());
  const auto opts = at::TensorOptions().dtype(z.scalar_type()).device(z.device());
  return {bn.running_mean.view({1, c, 1, 1}).to(opts), at::sqrt(bn.running_var.view({1, c, 1, 1}) + eps).to(opts)};
}

}  // namespace

at::Tensor LatentBatchNormImpl::Denormalize(const at::Tensor& z, double eps) const {
  const auto [mean, std] = Statistics(*this, z, eps);
  return z * std + mean;
}

at::Tensor LatentBatchNormImpl::Normalize(const at::Tensor& x, double eps) const {
  const auto [mean, std] = Statistics(*this, x, eps);
  return (x - mean) / std;
}

at::Tensor UnpatchifyLatents(const at::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1) / (ph * pw), h = x.size(2), w = x.size(3);
  TORCH_CHECK(x.size(1) == c * ph * pw, "cannot unpatchify ", x.size(1), " channels into ", ph, "x", pw, " patches");
  return x.reshape({b, c, ph, pw, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c, h * ph, w * pw});
}

at::Tensor PatchifyLatents(const at::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2) / ph, w = x.size(3) / pw;
  TORCH_CHECK(x.size(2) == h * ph && x.size(3) == w * pw, "cannot patchify ", x.sizes(), " into ", ph, "x", pw,
              " patches");
  return x.reshape({b, c, h, ph, w, pw}).permute({0, 1, 3, 5, 2, 4}).reshape({b, c * ph * pw, h, w});
}

}  // namespace vaedecode::families::flux2
