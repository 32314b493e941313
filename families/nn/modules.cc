#include "families/nn/modules.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>

namespace vaedecode::families::nn {
namespace {

constexpr double kNormalizeEps = 1e-12;  // F.normalize's default eps

}  // namespace

torch::nn::Conv2d MakeConv2d(int64_t in, int64_t out, int64_t kernel) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).padding((kernel - 1) / 2));
}

torch::nn::GroupNorm MakeGroupNorm(int64_t groups, int64_t channels, double eps) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(eps).affine(true));
}

at::Tensor RunConv2d(LayerOps& ops, const torch::nn::Conv2dImpl& conv, const at::Tensor& x) {
  ConvGeometry g;
  g.padding_h = (conv.weight.size(2) - 1) / 2;
  g.padding_w = (conv.weight.size(3) - 1) / 2;
  return ops.Conv(x, conv.weight, conv.bias, g);
}

torch::nn::Conv3d MakeConv3d(int64_t in, int64_t out, int64_t kernel) {
  return torch::nn::Conv3d(torch::nn::Conv3dOptions(in, out, kernel).padding((kernel - 1) / 2));
}

at::Tensor RunConv3d(LayerOps& ops, const torch::nn::Conv3dImpl& conv, const at::Tensor& x) {
  ConvGeometry g;
  g.padding_t = (conv.weight.size(2) - 1) / 2;
  g.padding_h = (conv.weight.size(3) - 1) / 2;
  g.padding_w = (conv.weight.size(4) - 1) / 2;
  return ops.Conv(x, conv.weight, conv.bias, g);
}

at::Tensor RunGroupNorm(LayerOps& ops, const torch::nn::GroupNorm& norm, const at::Tensor& x) {
  return ops.GroupNorm(x, norm->options.num_groups(), norm->weight, norm->bias, norm->options.eps());
}

ChannelRMSNormImpl::ChannelRMSNormImpl(int64_t dim, bool images) : scale_(std::sqrt(static_cast<double>(dim))) {
  gamma = register_parameter("gamma", images ? at::ones({dim, 1, 1}) : at::ones({dim, 1, 1, 1}));
}

at::Tensor ChannelRMSNormImpl::forward(const at::Tensor& x) {
  // diffusers normalises reduced-precision inputs in fp32.
  const bool upcast = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const at::Tensor in = upcast ? x.to(at::kFloat) : x;
  // F.normalize(in, dim=1): in / max(‖in‖₂ over channels, eps).
  const at::Tensor denom = in.norm(2.0, {1}, /*keepdim=*/true).clamp_min(kNormalizeEps).expand_as(in);
  const at::Tensor normalized = (in / denom).to(x.scalar_type());
  return normalized * scale_ * gamma;
}

ReplicateCausalConv3dImpl::ReplicateCausalConv3dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel) {
  conv = register_module("conv", torch::nn::Conv3d(torch::nn::Conv3dOptions(in_channels, out_channels, kernel)));
}

at::Tensor CausalFrames::Extend(const void* layer, const at::Tensor& x, int64_t keep) {
  auto it = kept_.find(layer);
  const at::Tensor before = it != kept_.end() ? it->second : x.narrow(2, 0, 1).repeat({1, 1, keep, 1, 1});
  const at::Tensor extended = at::cat({before, x}, 2);
  if (clip_ends_) {
    kept_.erase(layer);
  } else {
    // A copy: a view would keep the whole extended input alive.
    kept_[layer] = extended.narrow(2, extended.size(2) - keep, keep).clone();
  }
  return extended;
}

int64_t CausalFrames::bytes() const {
  int64_t total = 0;
  for (const auto& [layer, frames] : kept_) total += static_cast<int64_t>(frames.nbytes());
  return total;
}

at::Tensor ReplicateCausalConv3dImpl::forward(const at::Tensor& x, LayerOps& ops, CausalFrames* frames) {
  const int64_t kt = conv->weight.size(2);
  // Temporal replicate padding: k-1 copies of the first frame in front (a
  // stream's later chunks: the frames before them).
  const at::Tensor padded = kt <= 1             ? x
                            : frames != nullptr ? frames->Extend(this, x, kt - 1)
                                                : at::cat({x.narrow(2, 0, 1).repeat({1, 1, kt - 1, 1, 1}), x}, 2);
  ConvGeometry g;
  g.padding_h = conv->weight.size(3) / 2;
  g.padding_w = conv->weight.size(4) / 2;
  g.mode = PaddingMode::kReplicate;
  return ops.Conv(padded, conv->weight, conv->bias, g);
}

at::Tensor Unpatchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1) / (p * p), f = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor y = x.reshape({b, c, p, p, f, h, w});    // [B, C, dx, dy, F, H, W]
  y = y.permute({0, 1, 4, 5, 3, 6, 2}).contiguous();  // [B, C, F, H, dy, W, dx]
  return y.view({b, c, f, h * p, w * p});
}

at::Tensor Patchify(const at::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2), h = x.size(3) / p, w = x.size(4) / p;
  TORCH_CHECK(h * p == x.size(3) && w * p == x.size(4), "patchify by ", p, " of ", x.size(3), "x", x.size(4));
  at::Tensor y = x.reshape({b, c, f, h, p, w, p});    // [B, C, F, H, dy, W, dx]
  y = y.permute({0, 1, 6, 4, 2, 3, 5}).contiguous();  // [B, C, dx, dy, F, H, W]
  return y.view({b, c * p * p, f, h, w});
}

at::Tensor SubpixelMajorDepthToSpace(const at::Tensor& x, int64_t rt, int64_t rh, int64_t rw) {
  const int64_t b = x.size(0), c = x.size(1) / (rt * rh * rw);
  if (x.dim() == 4) {
    TORCH_CHECK(rt == 1, "a 4-D depth-to-space has no time axis");
    const int64_t h = x.size(2), w = x.size(3);
    at::Tensor y = x.reshape({b, rh, rw, c, h, w});  // [B, dy, dx, C, H, W]
    y = y.permute({0, 3, 4, 1, 5, 2});               // [B, C, H, dy, W, dx]
    return y.reshape({b, c, h * rh, w * rw});
  }
  const int64_t t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor y = x.reshape({b, rt, rh, rw, c, t, h, w});  // [B, dt, dy, dx, C, T, H, W]
  y = y.permute({0, 4, 5, 1, 6, 2, 7, 3});                // [B, C, T, dt, H, dy, W, dx]
  return y.reshape({b, c, t * rt, h * rh, w * rw});
}

at::Tensor ChannelGroupMean(const at::Tensor& x, int64_t groups) {
  std::vector<int64_t> shape = x.sizes().vec();
  TORCH_CHECK(groups > 0 && shape[1] % groups == 0, shape[1], " channels in ", groups, " groups");
  shape[1] /= groups;
  shape.insert(shape.begin() + 1, groups);  // [B, groups, C / groups, ...]
  return x.view(shape).mean(2);
}

at::Tensor SubpixelMajorSpaceToDepth(const at::Tensor& x, int64_t rt, int64_t rh, int64_t rw) {
  const int64_t b = x.size(0), c = x.size(1);
  if (x.dim() == 4) {
    TORCH_CHECK(rt == 1, "a 4-D space-to-depth has no time axis");
    const int64_t h = x.size(2) / rh, w = x.size(3) / rw;
    TORCH_CHECK(h * rh == x.size(2) && w * rw == x.size(3), "a ", rh, "x", rw, " space-to-depth of ", x.sizes());
    return x.reshape({b, c, h, rh, w, rw}).permute({0, 3, 5, 1, 2, 4}).reshape({b, rh * rw * c, h, w});
  }
  const int64_t t = x.size(2) / rt, h = x.size(3) / rh, w = x.size(4) / rw;
  TORCH_CHECK(t * rt == x.size(2) && h * rh == x.size(3) && w * rw == x.size(4), "a ", rt, "x", rh, "x", rw,
              " space-to-depth of ", x.sizes());
  return x.reshape({b, c, t, rt, h, rh, w, rw})
      .permute({0, 3, 5, 7, 1, 2, 4, 6})  // [B, dt, dy, dx, C, T, H, W]
      .reshape({b, rt * rh * rw * c, t, h, w});
}

at::Tensor UpsampleNearest(const at::Tensor& x, int64_t factor_t, int64_t factor_s) {
  if (x.dim() == 4) {
    TORCH_CHECK(factor_t == 1, "a 4-D tensor has no frames to upsample");
    return at::upsample_nearest2d(x, {x.size(2) * factor_s, x.size(3) * factor_s});
  }
  TORCH_CHECK(x.dim() == 5, "nearest upsampling takes [B, C, H, W] or [B, C, T, H, W], got ", x.dim(), "-D");
  return at::upsample_nearest3d(x, {x.size(2) * factor_t, x.size(3) * factor_s, x.size(4) * factor_s});
}

at::Tensor AntiAliasUpsample1d(const at::Tensor& x, const at::Tensor& filter, int64_t ratio) {
  const int64_t channels = x.size(1), taps = filter.size(2);
  const int64_t pad = taps / ratio - 1;
  const int64_t crop_left = pad * ratio + (taps - ratio) / 2;
  const int64_t crop_right = pad * ratio + (taps - ratio + 1) / 2;
  const at::Tensor h =
      at::conv_transpose1d(at::pad(x, {pad, pad}, "replicate"), filter.to(x.scalar_type()).expand({channels, 1, taps}),
                           at::Tensor(), at::IntArrayRef{ratio}, at::IntArrayRef{0}, at::IntArrayRef{0}, channels) *
      ratio;
  return h.narrow(2, crop_left, h.size(2) - crop_left - crop_right);
}

at::Tensor LowPassDownsample1d(const at::Tensor& x, const at::Tensor& filter, int64_t ratio) {
  const int64_t channels = x.size(1), taps = filter.size(2);
  const at::Tensor h = at::pad(x, {taps / 2 + taps % 2 - 1, taps / 2}, "replicate");
  return at::conv1d(h, filter.expand({channels, 1, taps}), at::Tensor(), at::IntArrayRef{ratio}, at::IntArrayRef{0},
                    at::IntArrayRef{1}, channels);
}

SnakeBetaImpl::SnakeBetaImpl(int64_t channels, bool use_beta) {
  alpha = register_parameter("alpha", at::zeros({channels}));
  if (use_beta) beta = register_parameter("beta", at::zeros({channels}));
}

at::Tensor SnakeBetaImpl::forward(const at::Tensor& x) {
  const at::Tensor a = at::exp(alpha.view({1, -1, 1}));
  const at::Tensor amplitude = beta.defined() ? at::exp(beta.view({1, -1, 1})) : a;
  return x + at::reciprocal(amplitude + 1e-9) * at::sin(a * x).pow(2);
}

}  // namespace vaedecode::families::nn
