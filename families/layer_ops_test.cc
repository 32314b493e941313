#include "families/layer_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>

#include "device/counting_cpu_allocator.h"
#include "families/status_error.h"

namespace vaedecode::families {
namespace {

TEST(DenseOps, ZeroPaddedConvMatchesAten) {
  at::manual_seed(1);
  at::Tensor x = at::randn({2, 3, 7, 5});
  at::Tensor w = at::randn({4, 3, 3, 3});
  at::Tensor b = at::randn({4});
  DenseOps ops;
  ConvGeometry g;
  g.padding_h = g.padding_w = 1;
  EXPECT_TRUE(ops.Conv(x, w, b, g).equal(at::conv2d(x, w, b, 1, 1)));
}

TEST(DenseOps, ReplicateAndReflectPadEveryEdge) {
  at::manual_seed(2);
  at::Tensor x = at::randn({1, 2, 6, 5});
  at::Tensor w = at::randn({3, 2, 3, 3});
  at::Tensor b = at::randn({3});
  DenseOps ops;
  ConvGeometry g;
  g.padding_h = g.padding_w = 1;
  g.mode = PaddingMode::kReplicate;
  at::Tensor want = at::conv2d(at::replication_pad2d(x, {1, 1, 1, 1}), w, b);
  EXPECT_LE((ops.Conv(x, w, b, g) - want).abs().max().item<double>(), 1e-6);
  g.mode = PaddingMode::kReflect;
  want = at::conv2d(at::reflection_pad2d(x, {1, 1, 1, 1}), w, b);
  EXPECT_LE((ops.Conv(x, w, b, g) - want).abs().max().item<double>(), 1e-6);
}

TEST(DenseOps, Conv3dPadsTimeAndSpace) {
  at::manual_seed(3);
  at::Tensor x = at::randn({1, 2, 4, 5, 6});
  at::Tensor w = at::randn({2, 2, 3, 3, 3});
  at::Tensor b = at::randn({2});
  DenseOps ops;
  ConvGeometry g;
  g.padding_t = g.padding_h = g.padding_w = 1;
  EXPECT_LE((ops.Conv(x, w, b, g) - at::conv3d(x, w, b, 1, 1)).abs().max().item<double>(), 1e-6);
  g.mode = PaddingMode::kReplicate;
  at::Tensor want = at::conv3d(at::replication_pad3d(x, {1, 1, 1, 1, 1, 1}), w, b);
  EXPECT_LE((ops.Conv(x, w, b, g) - want).abs().max().item<double>(), 1e-5);
}

TEST(DenseOps, CircularPaddingIsRefusedClearly) {
  DenseOps ops;
  ConvGeometry g;
  g.padding_h = g.padding_w = 1;
  g.mode = PaddingMode::kCircular;
  EXPECT_THROW(ops.Conv(at::zeros({1, 1, 4, 4}), at::zeros({1, 1, 3, 3}), at::zeros({1}), g), c10::Error);
}

TEST(ScaledDotProductAttention, MatchesTheFormulaAndChunksExactly) {
  at::manual_seed(4);
  at::Tensor q = at::randn({2, 1, 37, 8});
  at::Tensor k = at::randn({2, 1, 37, 8});
  at::Tensor v = at::randn({2, 1, 37, 8});
  at::Tensor want = at::matmul(at::softmax(at::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0), -1), v);
  EXPECT_LE((ScaledDotProductAttention(q, k, v) - want).abs().max().item<double>(), 1e-5);
}

TEST(CancellableDenseOps, ALongAttentionGoesInQueryChunksThatComputeTheSame) {
  at::manual_seed(5);
  // 1 x 1 heads x 5000 queries x 5000 keys: 25M scores, more than one call's worth.
  const at::Tensor q = at::randn({1, 1, 5000, 16});
  const at::Tensor k = at::randn({1, 1, 5000, 16});
  const at::Tensor v = at::randn({1, 1, 5000, 16});
  ASSERT_GT(5000 * 5000, CancellableDenseOps::kScoresPerCall);
  std::atomic<bool> cancelled{false};
  CancellableDenseOps ops(&cancelled);
  const at::Tensor chunked = ops.Attention(q, k, v, TokenLayout::Full(100));
  EXPECT_LE((chunked - ScaledDotProductAttention(q, k, v)).abs().max().item<double>(), 1e-6);

  cancelled = true;
  EXPECT_THROW(ops.Attention(q, k, v, TokenLayout::Full(100)), StatusError);
}

TEST(CancellableDenseOps, FrameCausalAttentionGoesFrameByFrameAndComputesTheSame) {
  at::manual_seed(7);
  // 3 frames of 2000 tokens: the last frame's 2000 x 6000 scores (x 2
  // heads) exceed one call, so it goes in query chunks too.
  const at::Tensor q = at::randn({1, 2, 3, 2000, 8});
  const at::Tensor k = at::randn({1, 2, 3, 2000, 8});
  const at::Tensor v = at::randn({1, 2, 3, 2000, 8});
  ASSERT_GT(2 * 2000 * 6000, CancellableDenseOps::kScoresPerCall);
  std::atomic<bool> cancelled{false};
  CancellableDenseOps ops(&cancelled);
  const at::Tensor want = DenseOps().Attention(q, k, v, TokenLayout::FrameCausal(50));
  const at::Tensor got = ops.Attention(q, k, v, TokenLayout::FrameCausal(50));
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-6);

  cancelled = true;
  EXPECT_THROW(ops.Attention(q, k, v, TokenLayout::FrameCausal(50)), StatusError);
}

TEST(CancellableDenseOps, ALargeConvGoesInSamplesAndRowBandsThatComputeTheSame) {
  at::manual_seed(6);
  std::atomic<bool> cancelled{false};
  CancellableDenseOps ops(&cancelled);
  DenseOps dense;

  // 2 samples x 8 channels x 1100 x 1000 outputs: two bands per sample.
  const at::Tensor x = at::randn({2, 6, 1100, 1000});
  const at::Tensor w = at::randn({8, 6, 3, 3});
  const at::Tensor b = at::randn({8});
  ASSERT_GT(8 * 1100 * 1000, CancellableDenseOps::kConvOutputsPerCall);
  for (PaddingMode mode : {PaddingMode::kZeros, PaddingMode::kReplicate, PaddingMode::kReflect}) {
    ConvGeometry g;
    g.padding_h = g.padding_w = 1;
    g.mode = mode;
    const at::Tensor want = dense.Conv(x, w, b, g);
    const at::Tensor got = ops.Conv(x, w, b, g);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-4) << static_cast<int>(mode);
  }
  // A dilated 5x5 kernel reaches further: the bands' halos follow.
  ConvGeometry wide;
  wide.padding_h = wide.padding_w = 4;
  wide.dilation = 2;
  wide.mode = PaddingMode::kReflect;
  const at::Tensor w5 = at::randn({8, 6, 5, 5});
  EXPECT_LE((ops.Conv(x, w5, b, wide) - dense.Conv(x, w5, b, wide)).abs().max().item<double>(), 1e-4);
  // 3-D convolutions too ([B, C, T, H, W], rows are H).
  const at::Tensor v = at::randn({1, 4, 3, 800, 600});
  const at::Tensor w3 = at::randn({6, 4, 3, 3, 3});
  ConvGeometry g3;
  g3.padding_t = g3.padding_h = g3.padding_w = 1;
  g3.mode = PaddingMode::kReplicate;
  EXPECT_LE(
      (ops.Conv(v, w3, b.narrow(0, 0, 6), g3) - dense.Conv(v, w3, b.narrow(0, 0, 6), g3)).abs().max().item<double>(),
      1e-4);
  cancelled = true;
  EXPECT_THROW(ops.Conv(x, w, b, ConvGeometry{}), StatusError);
}

TEST(PadForConv, PadsRowsColumnsAndFramesAsTheReference) {
  at::Tensor x = at::arange(6, at::kFloat).view({1, 1, 3, 2});
  ConvGeometry g;
  g.padding_w = 1;
  g.mode = PaddingMode::kReplicate;
  at::Tensor p = PadForConv(x, 2, 1, g, /*temporal=*/false);
  ASSERT_EQ(p.sizes(), (std::vector<int64_t>{1, 1, 6, 4}));
  EXPECT_TRUE(p.equal(at::replication_pad2d(x, {1, 1, 2, 1})));
  at::manual_seed(8);
  const at::Tensor v = at::randn({2, 3, 4, 5, 6});
  g.padding_t = 1;
  for (PaddingMode mode : {PaddingMode::kReplicate, PaddingMode::kReflect}) {
    g.mode = mode;
    const at::Tensor want = mode == PaddingMode::kReplicate ? at::replication_pad3d(v, {1, 1, 2, 0, 1, 1})
                                                            : at::reflection_pad3d(v, {1, 1, 2, 0, 1, 1});
    EXPECT_TRUE(PadForConv(v, 2, 0, g, /*temporal=*/true).equal(want));
  }
}

// LTX-2 and HunyuanVideo convolve with replicate padding at every layer: the
// padding must cost one copy of the input, as diffusers' F.pad does, not a
// transposed copy per dim (which also tripped CUDA's 1-D pad on more than
// 65 535 planes).
TEST(DenseOps, ReplicatePaddedConvMakesOnePaddedCopy) {
  device::CountingCpuAllocator& memory = device::CountingCpuAllocator::Install();
  const at::Tensor x = at::randn({1, 2, 3, 96, 128});
  const at::Tensor w = at::randn({2, 2, 3, 3, 3});
  const at::Tensor b = at::randn({2});
  ConvGeometry g;
  g.padding_t = g.padding_h = g.padding_w = 1;
  g.mode = PaddingMode::kReplicate;
  DenseOps ops;
  const at::Tensor want = at::conv3d(at::replication_pad3d(x, {1, 1, 1, 1, 1, 1}), w, b);
  // What LibTorch itself allocates for the convolution of an already padded input.
  const at::Tensor padded = at::replication_pad3d(x, {1, 1, 1, 1, 1, 1});
  memory.ResetPeak();
  int64_t base = memory.current_bytes();
  (void)at::conv3d(padded, w, b);
  const int64_t conv_only = memory.peak_bytes() - base;
  memory.ResetPeak();
  base = memory.current_bytes();
  const at::Tensor got = ops.Conv(x, w, b, g);
  const int64_t with_padding = memory.peak_bytes() - base;
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
  EXPECT_LE(with_padding, conv_only + padded.nbytes())
      << "conv alone " << conv_only << ", padded copy " << padded.nbytes();
}

}  // namespace
}  // namespace vaedecode::families
