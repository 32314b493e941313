// ShardedLayerOps (halo convolution, merged GroupNorm, gathered-K/V attention)
// against DenseOps over real Gloo, one process per rank, world sizes 1-4,
// uneven bands, and at an upsampled resolution (bands scale with the rows).

#include "families/sharded_layer_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/layer_ops.h"
#include "families/status_error.h"
#include "parallel/counting_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"

namespace vaedecode::families {
namespace {

using parallel::testing::ExpectTensorClose;

constexpr int64_t kLatentRows = 7;  // uneven over 2, 3 and 4 ranks

// A Gloo group of `world` ranks on `port` for one test body.
absl::StatusOr<std::unique_ptr<parallel::Communicator>> Join(int rank, int world, int port, absl::Duration timeout,
                                                             const std::string& group = "") {
  parallel::GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_port = port;
  if (!group.empty()) o.group_name = group;
  o.timeout = timeout;
  return parallel::GlooCommunicator::Create(o);
}

struct Case {
  int64_t kernel;
  int64_t dilation;
  PaddingMode mode;
  int64_t scale;  // resolution relative to the latent (rows = 7 * scale)
  bool video;
};

absl::Status RunCase(const Case& c, int rank, int world, int port) {
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                   Join(rank, world, port, absl::Seconds(20), "sharded-layer-ops"));

  at::manual_seed(c.kernel * 100 + c.dilation);
  const int64_t rows = kLatentRows * c.scale;
  at::Tensor x = c.video ? at::randn({2, 3, 3, rows, 6}) : at::randn({2, 3, rows, 6});
  std::vector<int64_t> wshape = {4, 3, c.kernel, c.kernel};
  if (c.video) wshape.insert(wshape.begin() + 2, 3);
  at::Tensor w = at::randn(wshape), b = at::randn({4});
  ConvGeometry g;
  g.padding_h = g.padding_w = (c.kernel - 1) / 2 * c.dilation;
  g.padding_t = c.video ? 1 : 0;
  g.dilation = c.dilation;
  g.mode = c.mode;

  const int h = static_cast<int>(x.dim()) - 2;
  parallel::ShardSpec latent_spec = parallel::ShardSpec::ForRows(h, kLatentRows, rank, world);
  parallel::ShardSpec spec = latent_spec.Scaled(c.scale);
  const parallel::Band band = spec.local_band();
  at::Tensor local = x.narrow(h, band.begin, band.size()).contiguous();

  DenseOps dense;
  parallel::CountingCommunicator counting(*comm);
  ShardedLayerOps sharded(counting, latent_spec);
  const std::string what = absl::StrCat("conv k=", c.kernel, " d=", c.dilation, " mode=", static_cast<int>(c.mode),
                                        " scale=", c.scale, c.video ? " 3d" : " 2d");
  try {
    at::Tensor want = dense.Conv(x, w, b, g).narrow(h, band.begin, band.size());
    // Overlapped with the halo's travel (the default) and waiting for it:
    // both exact, one exchange each.
    for (bool overlap : {true, false}) {
      sharded.set_overlap_halo(overlap);
      counting.Reset();
      RETURN_IF_ERROR(ExpectTensorClose(sharded.Conv(local, w, b, g), want, 1e-5, 0,
                                        absl::StrCat(what, overlap ? " overlapped" : " waiting")));
      const int64_t halo_calls = (world > 1 && c.kernel > 1) ? 1 : 0;
      if (counting.stats().collectives() != halo_calls) {
        return absl::InternalError(absl::StrCat(what, ": ", counting.ToString()));
      }
    }

    at::Tensor gw = at::randn({3}), gb = at::randn({3});
    want = dense.GroupNorm(x, 3, gw, gb, 1e-6).narrow(h, band.begin, band.size());
    RETURN_IF_ERROR(ExpectTensorClose(sharded.GroupNorm(local, 3, gw, gb, 1e-6), want, 1e-5, 0, what + " group norm"));
  } catch (const StatusError& e) {
    return e.status();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
  return absl::OkStatus();
}

class ShardedConv : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedConv, EqualsDenseAtEveryWorldSize) {
  for (int world = 1; world <= 4; ++world) {
    absl::Status s = parallel::testing::RunRanks(
        world, [&](int rank, int w, int port) { return RunCase(GetParam(), rank, w, port); }, absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, ShardedConv,
    ::testing::Values(Case{1, 1, PaddingMode::kZeros, 1, false}, Case{3, 1, PaddingMode::kZeros, 1, false},
                      Case{5, 1, PaddingMode::kZeros, 2, false}, Case{3, 2, PaddingMode::kZeros, 2, false},
                      Case{3, 1, PaddingMode::kReplicate, 2, false}, Case{3, 1, PaddingMode::kReflect, 2, false},
                      Case{3, 1, PaddingMode::kZeros, 1, true}, Case{3, 1, PaddingMode::kReplicate, 2, true},
                      // Bands of exactly 2·halo rows between two neighbours (world 4: 2,2,2,1 rows).
                      Case{3, 1, PaddingMode::kReplicate, 1, false}, Case{3, 1, PaddingMode::kReflect, 1, true}));

TEST(ShardedConv, ALargeBandGoesInRowBandsAndEqualsDense) {
  // 16 x 700 x 1400 outputs per band at 2 ranks, past kConvOutputsPerBand:
  // the band is convolved in row bands (its peak scales with one), with
  // halo rows at interior edges and the mode's padding at global ones.
  for (int world : {2, 3}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(30)));
          at::manual_seed(13);
          const int64_t scale = 200, rows = kLatentRows * scale;
          const at::Tensor x = at::randn({1, 6, rows, 1400});
          const at::Tensor weight = at::randn({16, 6, 3, 3}), bias = at::randn({16});
          const parallel::ShardSpec latent_spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
          const parallel::Band band = latent_spec.Scaled(scale).local_band();
          if (16 * band.size() * 1400 <= kConvOutputsPerBand) return absl::InternalError("the band fits one call");
          ShardedLayerOps sharded(*comm, latent_spec);
          for (PaddingMode mode : {PaddingMode::kZeros, PaddingMode::kReplicate, PaddingMode::kReflect}) {
            ConvGeometry g;
            g.padding_h = g.padding_w = 1;
            g.mode = mode;
            const at::Tensor want = DenseOps().Conv(x, weight, bias, g).narrow(2, band.begin, band.size());
            for (bool overlap : {true, false}) {
              sharded.set_overlap_halo(overlap);
              try {
                RETURN_IF_ERROR(ExpectTensorClose(
                    sharded.Conv(x.narrow(2, band.begin, band.size()).contiguous(), weight, bias, g), want, 1e-4, 0,
                    absl::StrCat("banded conv, mode ", static_cast<int>(mode),
                                 overlap ? ", overlapped" : ", waiting")));
              } catch (const StatusError& e) {
                return e.status();
              }
            }
          }
          return absl::OkStatus();
        },
        absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(ShardedAttention, LocalQueriesAgainstGatheredKeysEqualDense) {
  for (int world = 1; world <= 4; ++world) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
          at::manual_seed(9);
          const int64_t width = 5;
          at::Tensor q = at::randn({2, 1, kLatentRows * width, 8});
          at::Tensor k = at::randn({2, 1, kLatentRows * width, 8});
          at::Tensor v = at::randn({2, 1, kLatentRows * width, 8});
          parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
          const parallel::Band b = spec.local_band();
          auto band = [&](const at::Tensor& t) { return t.narrow(2, b.begin * width, b.size() * width).contiguous(); };
          ShardedLayerOps sharded(*comm, spec);
          DenseOps dense;
          at::Tensor want = band(dense.Attention(q, k, v, TokenLayout::Full(width)));
          try {
            return ExpectTensorClose(sharded.Attention(band(q), band(k), band(v), TokenLayout::Full(width)), want, 1e-5,
                                     0, "attention");
          } catch (const StatusError& e) {
            return e.status();
          }
        },
        absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(ShardedAttention, SharedTokensEnterTheKeysOnceAndEveryRankAgreesOnThem) {
  // A ViT's layout: every rank's band of tokens, then 3 tokens every rank
  // holds alike. The dense reference sees each token once.
  for (int world = 1; world <= 4; ++world) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
          at::manual_seed(19);
          const int64_t width = 4, shared = 3;
          const int64_t tokens = kLatentRows * width;
          at::Tensor q = at::randn({2, 2, tokens + shared, 8});
          at::Tensor k = at::randn({2, 2, tokens + shared, 8});
          at::Tensor v = at::randn({2, 2, tokens + shared, 8});
          parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
          const parallel::Band b = spec.local_band();
          auto local = [&](const at::Tensor& t) {
            return at::cat({t.narrow(2, b.begin * width, b.size() * width), t.narrow(2, tokens, shared)}, 2);
          };
          ShardedLayerOps sharded(*comm, spec);
          DenseOps dense;
          const at::Tensor want = local(dense.Attention(q, k, v, TokenLayout::Full(width, shared)));
          try {
            const RowWindow window = sharded.GlobalRows(2 * b.size());  // an activation at twice the latent's rows
            if (window.first != 2 * b.begin || window.total != 2 * kLatentRows) {
              return absl::InternalError(absl::StrCat("rows window ", window.first, "/", window.total));
            }
            return ExpectTensorClose(sharded.Attention(local(q), local(k), local(v), TokenLayout::Full(width, shared)),
                                     want, 1e-5, 0, "attention with shared tokens");
          } catch (const StatusError& e) {
            return e.status();
          }
        },
        absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

// diffusers' formulation (HunyuanVideo's mid block): softmax over all T·N
// keys of q·kᵀ·scale plus a mask that is -inf where key frame > query frame.
at::Tensor MaskedFrameCausalReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), n = q.size(3), d = q.size(4);
  const at::Tensor frame = at::arange(t).repeat_interleave(n);  // frame of each token
  const at::Tensor mask = at::where(frame.unsqueeze(0) <= frame.unsqueeze(1), at::zeros({}),
                                    at::full({}, -std::numeric_limits<float>::infinity()));
  const at::Tensor scores = at::matmul(q.reshape({b, h, t * n, d}), k.reshape({b, h, t * n, d}).transpose(-2, -1)) /
                                std::sqrt(static_cast<double>(d)) +
                            mask;
  return at::matmul(at::softmax(scores, -1), v.reshape({b, h, t * n, d})).view({b, h, t, n, d});
}

TEST(ShardedAttention, FrameCausalEqualsTheMaskedReferenceWithOneGather) {
  for (int world = 1; world <= 4; ++world) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
          at::manual_seed(11);
          const int64_t width = 5, frames = 3;
          at::Tensor q = at::randn({2, 1, frames, kLatentRows * width, 8});
          at::Tensor k = at::randn({2, 1, frames, kLatentRows * width, 8});
          at::Tensor v = at::randn({2, 1, frames, kLatentRows * width, 8});
          // The tokens of a row band, in every frame.
          parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
          const parallel::Band b = spec.local_band();
          auto band = [&](const at::Tensor& t) { return t.narrow(3, b.begin * width, b.size() * width).contiguous(); };
          DenseOps dense;
          const at::Tensor want = dense.Attention(q, k, v, TokenLayout::FrameCausal(width));
          RETURN_IF_ERROR(ExpectTensorClose(want, MaskedFrameCausalReference(q, k, v), 1e-5, 0, "dense vs mask"));
          parallel::CountingCommunicator counting(*comm);
          ShardedLayerOps sharded(counting, spec);
          try {
            RETURN_IF_ERROR(
                ExpectTensorClose(sharded.Attention(band(q), band(k), band(v), TokenLayout::FrameCausal(width)),
                                  band(want), 1e-5, 0, "sharded frame-causal attention"));
            if (counting.stats().collectives() != (w > 1 ? 1 : 0)) {
              return absl::InternalError(absl::StrCat("one gather expected: ", counting.ToString()));
            }
            // A stream's way: its earlier frames' keys and values gathered
            // once and kept (GatherKeysValues: every rank's rows, as dense
            // holds them), the queries of the last frame against them with
            // the new frame's gathered in turn, no gather inside.
            auto [k_early, v_early] = sharded.GatherKeysValues(band(k).narrow(2, 0, frames - 1).contiguous(),
                                                               band(v).narrow(2, 0, frames - 1).contiguous(), width);
            RETURN_IF_ERROR(ExpectTensorClose(k_early, k.narrow(2, 0, frames - 1), 0, 0, "gathered keys"));
            RETURN_IF_ERROR(ExpectTensorClose(v_early, v.narrow(2, 0, frames - 1), 0, 0, "gathered values"));
            auto [k_last, v_last] = sharded.GatherKeysValues(band(k).narrow(2, frames - 1, 1).contiguous(),
                                                             band(v).narrow(2, frames - 1, 1).contiguous(), width);
            counting.Reset();
            const at::Tensor last = sharded.Attention(
                band(q).narrow(2, frames - 1, 1).contiguous(), at::cat({k_early, k_last}, 2),
                at::cat({v_early, v_last}, 2), TokenLayout::FrameCausal(width, frames - 1, /*keys_gathered=*/true));
            RETURN_IF_ERROR(ExpectTensorClose(last, band(want).narrow(2, frames - 1, 1), 1e-5, 0,
                                              "the last frame against kept keys"));
            if (counting.stats().collectives() != 0) {
              return absl::InternalError(absl::StrCat("gathered keys gathered again: ", counting.ToString()));
            }
          } catch (const StatusError& e) {
            return e.status();
          }
          return absl::OkStatus();
        },
        absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(ShardedAttention, TheLeadersCancelFlagStopsEveryRankAtTheSameOp) {
  absl::Status s = parallel::testing::RunRanks(
      3,
      [](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
        parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
        ShardedLayerOps sharded(*comm, spec);
        std::atomic<bool> cancelled{true};
        if (rank == 0) sharded.set_cancel_flag(&cancelled);
        const int64_t tokens = spec.local_rows() * 4;
        at::Tensor q = at::randn({1, 1, tokens, 8});
        try {
          sharded.Attention(q, q, q, TokenLayout::Full(4));
        } catch (const StatusError& e) {
          if (e.status().code() == absl::StatusCode::kCancelled) return absl::OkStatus();
          return e.status();
        }
        return absl::InternalError("attention ran to completion despite the leader's cancel flag");
      },
      absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShardedAttention, TheCancelFlagAlsoStopsFrameCausalAttention) {
  absl::Status s = parallel::testing::RunRanks(
      3,
      [](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
        parallel::ShardSpec spec = parallel::ShardSpec::ForRows(3, kLatentRows, rank, w);
        ShardedLayerOps sharded(*comm, spec);
        std::atomic<bool> cancelled{true};
        if (rank == 0) sharded.set_cancel_flag(&cancelled);
        at::Tensor q = at::randn({1, 1, 2, spec.local_rows() * 4, 8});
        try {
          sharded.Attention(q, q, q, TokenLayout::FrameCausal(4));
        } catch (const StatusError& e) {
          if (e.status().code() == absl::StatusCode::kCancelled) return absl::OkStatus();
          return e.status();
        }
        return absl::InternalError("frame-causal attention ran to completion despite the leader's cancel flag");
      },
      absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
}

// A decoder without GroupNorm or attention (LTX-2): the leader's flag rides
// the halo exchanges and every rank stops after the same one, W - 2
// exchanges after the leader saw it (the stop word needs W - 2 exchanges
// to reach the last rank). Bands 2,2,2,1 at 4 ranks: the 1-row band takes
// the non-overlapped path; 1x1 convs exchange nothing and do not count.
TEST(ShardedConv, WithHaloCancellationEveryRankStopsAfterTheSameExchange) {
  for (int world = 1; world <= 4; ++world) {
    for (bool overlap : {true, false}) {
      absl::Status s = parallel::testing::RunRanks(
          world,
          [overlap](int rank, int w, int port) -> absl::Status {
            ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
            const parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
            at::manual_seed(5);
            const at::Tensor x = at::randn({1, 2, kLatentRows, 5});
            const at::Tensor w3 = at::randn({2, 2, 3, 3}) * 0.3, w1 = at::randn({2, 2, 1, 1}), b = at::zeros({2});
            ConvGeometry g3;
            g3.padding_h = g3.padding_w = 1;
            g3.mode = PaddingMode::kReplicate;
            const ConvGeometry g1;
            at::Tensor local = x.narrow(2, spec.local_band().begin, spec.local_band().size()).contiguous();
            DenseOps dense;
            const at::Tensor want =
                dense.Conv(x, w3, b, g3).narrow(2, spec.local_band().begin, spec.local_band().size());
            ShardedLayerOps sharded(*comm, spec);
            sharded.set_overlap_halo(overlap);
            sharded.set_cancel_with_halo(true);
            std::atomic<bool> cancelled{false};
            if (rank == 0) sharded.set_cancel_flag(&cancelled);
            // Convs 0, 2, 4, ... are 3x3 (exchanges 0, 1, 2, ...); the flag goes
            // up before exchange 1.
            const int64_t stop_exchange = 1 + std::max(0, w - 2);
            for (int conv = 0; conv < 20; ++conv) {
              if (conv == 2) cancelled = true;
              try {
                at::Tensor y = conv % 2 == 0 ? sharded.Conv(local, w3, b, g3) : sharded.Conv(local, w1, b, g1);
                if (conv == 0) {
                  // The word travels beside the rows, not in them.
                  RETURN_IF_ERROR(ExpectTensorClose(y, want, 1e-5, 0, "first conv"));
                }
                local = y;
              } catch (const StatusError& e) {
                if (e.status().code() != absl::StatusCode::kCancelled) return e.status();
                if (conv != 2 * stop_exchange) {
                  return absl::InternalError(
                      absl::StrCat("rank ", rank, " stopped at conv ", conv, ", want ", 2 * stop_exchange));
                }
                return absl::OkStatus();
              }
            }
            return absl::InternalError(absl::StrCat("rank ", rank, " ran every conv despite the leader's cancel flag"));
          },
          absl::Seconds(60));
      EXPECT_TRUE(s.ok()) << "world size " << world << (overlap ? " overlapped" : " waiting") << ": " << s;
    }
  }
}

// Without it (every other family) a conv never reads the flag: the
// GroupNorm and attention collectives carry it, and the halo messages stay
// as they were.
TEST(ShardedConv, WithoutHaloCancellationConvsIgnoreTheFlag) {
  absl::Status s = parallel::testing::RunRanks(
      2,
      [](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port, absl::Seconds(20)));
        const parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, kLatentRows, rank, w);
        parallel::CountingCommunicator counting(*comm);
        ShardedLayerOps sharded(counting, spec);
        std::atomic<bool> cancelled{true};
        if (rank == 0) sharded.set_cancel_flag(&cancelled);
        ConvGeometry g;
        g.padding_h = g.padding_w = 1;
        at::Tensor local = at::randn({1, 2, spec.local_rows(), 5});
        try {
          for (int conv = 0; conv < 3; ++conv) local = sharded.Conv(local, at::randn({2, 2, 3, 3}), at::zeros({2}), g);
        } catch (const StatusError& e) {
          return e.status();
        }
        const parallel::OpCounters halo = counting.stats().ForKind(parallel::CallKind::kHalo);
        if (halo.calls != 3 || halo.sends != 3) return absl::InternalError(counting.ToString());
        return absl::OkStatus();
      },
      absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShardedConvRefusal, CircularPaddingIsRefused) {
  absl::Status s = parallel::testing::RunRanks(
      1,
      [](int rank, int w, int port) -> absl::Status {
        parallel::GlooOptions o;
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, parallel::GlooCommunicator::Create(o));
        ShardedLayerOps sharded(*comm, parallel::ShardSpec::ForRows(2, 4, 0, 1));
        ConvGeometry g;
        g.padding_h = g.padding_w = 1;
        g.mode = PaddingMode::kCircular;
        try {
          sharded.Conv(at::zeros({1, 1, 4, 4}), at::zeros({1, 1, 3, 3}), at::zeros({1}), g);
        } catch (const c10::Error& e) {
          return absl::OkStatus();
        }
        return absl::InternalError("circular padding was not refused");
      },
      absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace vaedecode::families
