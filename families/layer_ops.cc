#include "families/layer_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>

#include "families/status_error.h"

namespace vaedecode::families {
namespace {

std::string PadModeName(PaddingMode mode) {
  switch (mode) {
    case PaddingMode::kReplicate:
      return "replicate";
    case PaddingMode::kReflect:
      return "reflect";
    case PaddingMode::kCircular:
      return "circular";
    case PaddingMode::kZeros:
      break;
  }
  return "constant";
}

at::Tensor ConvNoPadding(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t pad_t,
                         int64_t pad_h, int64_t pad_w, int64_t dilation) {
  if (weight.dim() == 4) {
    return at::conv2d(x, weight, bias, /*stride=*/{1, 1}, /*padding=*/{pad_h, pad_w},
                      /*dilation=*/{dilation, dilation});
  }
  TORCH_CHECK(weight.dim() == 5, "conv weight must be 4-D or 5-D, got ", weight.dim(), "-D");
  return at::conv3d(x, weight, bias, {1, 1, 1}, {pad_t, pad_h, pad_w}, {dilation, dilation, dilation});
}

}  // namespace

at::Tensor PadForConv(const at::Tensor& x, int64_t top, int64_t bottom, const ConvGeometry& g, bool temporal) {
  const int64_t t = temporal ? g.padding_t : 0;
  if (top == 0 && bottom == 0 && g.padding_w == 0 && t == 0) return x;
  // at::pad lists pads from the last dim backwards: (W, H[, T]).
  std::vector<int64_t> pads = {g.padding_w, g.padding_w, top, bottom};
  if (x.dim() == 5) pads.insert(pads.end(), {t, t});
  if (g.mode == PaddingMode::kZeros) return at::constant_pad_nd(x, pads, 0);
  TORCH_CHECK(g.mode == PaddingMode::kReplicate || g.mode == PaddingMode::kReflect, "padding mode ",
              PadModeName(g.mode), " is not supported by the decoder ops");
  // One call of LibTorch's 2-D / 3-D pad on the whole tensor: one copy, and
  // its CUDA kernels index planes (B·C) in a grid that has no 65 535 limit,
  // unlike a 1-D pad over B·C·T·H "planes". Replicate and reflect are
  // separable per dim, so the joint pad is the reference's, corners included.
  return at::pad(x, pads, PadModeName(g.mode));
}

at::Tensor ConvWithRowPadding(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const ConvGeometry& g, int64_t top, int64_t bottom) {
  TORCH_CHECK(g.mode != PaddingMode::kCircular, "circular padding cannot be sharded by rows");
  const bool temporal = weight.dim() == 5;
  if (g.mode == PaddingMode::kZeros) {
    // The convolution pads T and W itself (and H when symmetric): the same
    // kernel call as the reference.
    if (top == bottom) return ConvNoPadding(x, weight, bias, g.padding_t, top, g.padding_w, g.dilation);
    return ConvNoPadding(at::constant_pad_nd(x, {0, 0, top, bottom}, 0), weight, bias, g.padding_t, 0, g.padding_w,
                         g.dilation);
  }
  return ConvNoPadding(PadForConv(x, top, bottom, g, temporal), weight, bias, 0, 0, 0, g.dilation);
}

at::Tensor ConvInRowBands(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const ConvGeometry& g,
                          int64_t pad_top, int64_t pad_bottom, const std::function<void()>& between) {
  const int64_t h_dim = x.dim() - 2;
  const int64_t height = x.size(h_dim);
  const int64_t reach = g.dilation * (weight.size(-2) - 1);  // input rows one output row spans
  const int64_t out_rows = height + pad_top + pad_bottom - reach;
  // Per output row: its outputs, and the im2col columns a CPU convolution
  // without a direct kernel builds for it (in channels × kernel volume per
  // output position), which dwarf the outputs when channels narrow.
  const int64_t positions_per_row = x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1) * height);
  const int64_t kernel_volume = weight.numel() / std::max<int64_t>(1, weight.size(0) * weight.size(1));
  const int64_t per_row = std::max(weight.size(0), x.size(1) * kernel_volume) * positions_per_row;
  // Only on CPUs (GPU kernels run asynchronously and size their own
  // workspaces); a band's rows cannot wrap around (circular padding).
  if (!x.is_cpu() || x.size(0) * per_row * out_rows <= kConvOutputsPerBand || g.mode == PaddingMode::kCircular ||
      out_rows <= 0) {
    // One call: DenseOps' own when the padding is the geometry's (the same
    // kernel call as the reference).
    return ConvWithRowPadding(x, weight, bias, g, pad_top, pad_bottom);
  }
  const int64_t band = std::max<int64_t>(1, kConvOutputsPerBand / per_row);
  at::Tensor out;  // allocated from the first band's shape: no second copy of the output
  bool first_call = true;
  for (int64_t b = 0; b < x.size(0); ++b) {
    const at::Tensor one = x.narrow(0, b, 1);
    for (int64_t r0 = 0; r0 < out_rows; r0 += band) {
      const int64_t r1 = std::min(out_rows, r0 + band);
      if (!first_call && between) between();
      first_call = false;
      // Input rows [r0 - pad_top, r1 - 1 - pad_top + reach], clipped; the clipped part is padding.
      const int64_t first = r0 - pad_top, last = r1 - 1 - pad_top + reach;
      const int64_t lo = std::max<int64_t>(0, first), hi = std::min<int64_t>(height - 1, last);
      const at::Tensor part =
          ConvWithRowPadding(one.narrow(h_dim, lo, hi - lo + 1), weight, bias, g, lo - first, last - hi);
      if (!out.defined()) {
        std::vector<int64_t> shape = part.sizes().vec();
        shape[0] = x.size(0);
        shape[h_dim] = out_rows;
        out = at::empty(shape, part.options());
      }
      out.narrow(0, b, 1).narrow(h_dim, r0, r1 - r0).copy_(part);
    }
  }
  return out;
}

at::Tensor StridedConvWithRowPadding(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                     const StridedConvGeometry& g, int64_t top, int64_t bottom) {
  const bool volumetric = weight.dim() == 5;
  TORCH_CHECK(weight.dim() == 4 || volumetric, "conv weight must be 4-D or 5-D, got ", weight.dim(), "-D");
  TORCH_CHECK(g.stride >= 1, "stride must be positive");
  // at::pad lists pads from the last dim backwards: (W, H[, T]).
  std::vector<int64_t> pads = {g.pad_left, g.pad_right, top, bottom};
  if (volumetric) pads.insert(pads.end(), {g.padding_t, g.padding_t});
  const bool any = std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; });
  at::Tensor padded = x;
  if (any && g.mode == PaddingMode::kZeros) {
    padded = at::constant_pad_nd(x, pads, 0);
  } else if (any) {
    TORCH_CHECK(g.mode == PaddingMode::kReplicate || g.mode == PaddingMode::kReflect, "padding mode ",
                PadModeName(g.mode), " is not supported by the encoder ops");
    padded = at::pad(x, pads, PadModeName(g.mode));
  }
  if (volumetric) return at::conv3d(padded, weight, bias, {g.stride_t, g.stride, g.stride});
  return at::conv2d(padded, weight, bias, {g.stride, g.stride});
}

at::Tensor LayerOps::StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const StridedConvGeometry& g) {
  return StridedConvWithRowPadding(x, weight, bias, g, g.pad_top, g.pad_bottom);
}

at::Tensor ConvWithRowsProvided(const at::Tensor& x_with_rows, const at::Tensor& weight, const at::Tensor& bias,
                                const ConvGeometry& g) {
  return ConvWithRowPadding(x_with_rows, weight, bias, g, 0, 0);
}

at::Tensor DenseOps::Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const ConvGeometry& g) {
  return ConvWithRowPadding(x, weight, bias, g, g.padding_h, g.padding_h);
}

at::Tensor DenseOps::GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight,
                               const at::Tensor& bias, double eps) {
  return at::group_norm(x, num_groups, weight, bias, eps);
}

at::Tensor DenseOps::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const TokenLayout& layout) {
  if (layout.kind == TokenLayout::Kind::kFrameCausal) {
    return FrameCausalScaledDotProductAttention(q, k, v, layout.key_frames_before);
  }
  return ScaledDotProductAttention(q, k, v);  // whole tensors: the shared tokens are just tokens
}

at::Tensor CancellableDenseOps::StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                            const StridedConvGeometry& g) {
  CheckCancelled();
  return dense_.StridedConv(x, weight, bias, g);
}

void CancellableDenseOps::CheckCancelled() const {
  if (cancelled_ != nullptr && cancelled_->load()) {
    throw StatusError(absl::CancelledError("the request was cancelled"));
  }
}

at::Tensor CancellableDenseOps::Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                     const ConvGeometry& g) {
  CheckCancelled();
  // A convolution at a large image's full resolution runs for seconds on a
  // CPU: in bands, with a check between them. The image's own top and
  // bottom edges are padded with the geometry's mode, as the sharded ops do
  // at a global edge.
  return ConvInRowBands(x, weight, bias, g, g.padding_h, g.padding_h, [this] { CheckCancelled(); });
}

at::Tensor CancellableDenseOps::GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight,
                                          const at::Tensor& bias, double eps) {
  CheckCancelled();
  return dense_.GroupNorm(x, num_groups, weight, bias, eps);
}

at::Tensor CancellableDenseOps::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const TokenLayout& layout) {
  CheckCancelled();
  if (layout.kind == TokenLayout::Kind::kFull) return ChunkedAttention(q, k, v);
  const int64_t before = layout.key_frames_before;
  CheckFrameCausalShapes(q, k, v, before);
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < q.size(2); ++t) {
    if (t > 0) CheckCancelled();
    out.push_back(ChunkedAttention(q.select(2, t).contiguous(),
                                   k.narrow(2, 0, before + t + 1).flatten(2, 3).contiguous(),
                                   v.narrow(2, 0, before + t + 1).flatten(2, 3).contiguous()));
  }
  return at::stack(out, 2);
}

at::Tensor CancellableDenseOps::ChunkedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  // One attention over a large latent's tokens can run for minutes on a CPU
  // (scores grow with tokens squared); a cancelled request would hold its
  // group that long. Past kScoresPerCall the queries go in chunks with a
  // check between them: each query row's result depends only on that row
  // and all keys, so the chunks compute the same values.
  const int64_t queries = q.size(-2);
  const int64_t keys = k.size(-2);
  const int64_t batch_heads = queries == 0 ? 1 : q.numel() / (queries * q.size(-1));
  const int64_t rows = std::max<int64_t>(1, kScoresPerCall / std::max<int64_t>(1, keys * batch_heads));
  if (rows >= queries || !q.is_cpu()) return ScaledDotProductAttention(q, k, v);
  std::vector<at::Tensor> parts;
  for (int64_t start = 0; start < queries; start += rows) {
    if (start > 0) CheckCancelled();
    parts.push_back(ScaledDotProductAttention(q.narrow(-2, start, std::min(rows, queries - start)), k, v));
  }
  return at::cat(parts, -2);
}

void CheckFrameCausalShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t key_frames_before) {
  TORCH_CHECK(q.dim() == 5 && k.dim() == 5 && v.dim() == 5 && key_frames_before >= 0 &&
                  k.size(2) == key_frames_before + q.size(2) && v.size(2) == k.size(2),
              "frame-causal attention takes [B, heads, T, N, D] tensors, the keys' frames the queries' and ",
              key_frames_before, " before them");
}

at::Tensor FrameCausalScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                int64_t key_frames_before) {
  CheckFrameCausalShapes(q, k, v, key_frames_before);
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < q.size(2); ++t) {
    // Contiguous, so the kernel (and its rounding) depends on the sizes
    // alone, not on how many frames the tensors they come from hold: a
    // stream's chunks then compute what the whole clip does, batch > 1 too.
    out.push_back(ScaledDotProductAttention(q.select(2, t).contiguous(),
                                            k.narrow(2, 0, key_frames_before + t + 1).flatten(2, 3).contiguous(),
                                            v.narrow(2, 0, key_frames_before + t + 1).flatten(2, 3).contiguous()));
  }
  return at::stack(out, 2);  // [B, heads, T, Nq, D]
}

at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  // LibTorch picks the kernel (flash or memory-efficient where the shapes
  // allow, else the math path); calibration measures what it allocates.
  return at::scaled_dot_product_attention(q, k, v);
}

}  // namespace vaedecode::families
