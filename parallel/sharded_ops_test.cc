// The exact-sharding operators against the unsharded op, over real Gloo in
// one process per rank, at world sizes 1-4 with uneven bands.

#include "parallel/sharded_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "parallel/counting_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel {
namespace {

using testing::ExpectTensorClose;
using testing::ExpectTensorEqual;

absl::StatusOr<std::unique_ptr<Communicator>> Join(int rank, int world, int port) {
  GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_port = port;
  o.group_name = "sharded-ops-test";
  o.timeout = absl::Seconds(20);
  return GlooCommunicator::Create(o);
}

// Runs `body(comm, rank, world)` on every rank for each world size 1..4.
void ForWorldSizes(const std::function<absl::Status(Communicator&, int, int)>& body) {
  for (int world = 1; world <= 4; ++world) {
    absl::Status s = testing::RunRanks(
        world,
        [&](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, Join(rank, w, port));
          return body(*comm, rank, w);
        },
        absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(ExchangeHalo, BringsTheNeighboursRealRows) {
  ForWorldSizes([](Communicator& comm, int rank, int world) -> absl::Status {
    const int64_t rows = 11, halo = 2;  // uneven at 2, 3 and 4 ranks
    at::Tensor full = at::arange(2 * 3 * rows * 4, at::kFloat).view({2, 3, rows, 4});
    ShardSpec spec = ShardSpec::ForRows(2, rows, rank, world);
    const Band b = spec.local_band();
    ASSIGN_OR_RETURN(at::Tensor got, ExchangeHalo(comm, full.narrow(2, b.begin, b.size()), spec, halo));
    const int64_t begin = std::max<int64_t>(0, b.begin - halo);
    const int64_t end = std::min<int64_t>(rows, b.end + halo);
    return ExpectTensorEqual(got, full.narrow(2, begin, end - begin), "band with halo");
  });
}

TEST(ExchangeHalo, ASignalWordReachesTheNeighboursInTheSameCall) {
  ForWorldSizes([](Communicator& comm, int rank, int world) -> absl::Status {
    const int64_t rows = 11, halo = 1;
    const std::vector<int64_t> words = {5, 9, 3, 7};
    at::Tensor full = at::arange(3 * rows * 4, at::kFloat).view({3, rows, 4});
    ShardSpec spec = ShardSpec::ForRows(1, rows, rank, world);
    const Band b = spec.local_band();
    CountingCommunicator counting(comm);
    int64_t word = words[rank];
    ASSIGN_OR_RETURN(at::Tensor got,
                     ExchangeHalo(counting, full.narrow(1, b.begin, b.size()), spec, halo, false, &word));
    int64_t want = words[rank];
    if (rank > 0) want = std::min(want, words[rank - 1]);
    if (rank + 1 < world) want = std::min(want, words[rank + 1]);
    if (word != want) return absl::InternalError(absl::StrCat("rank ", rank, " got word ", word, ", want ", want));
    // The word rides in the halo's own call: still one call per exchange.
    const int64_t calls = counting.stats().ForKind(CallKind::kHalo).calls;
    if (calls != (world > 1 ? 1 : 0)) return absl::InternalError(absl::StrCat(calls, " halo calls"));
    const int64_t begin = std::max<int64_t>(0, b.begin - halo);
    const int64_t end = std::min<int64_t>(rows, b.end + halo);
    return ExpectTensorEqual(got, full.narrow(1, begin, end - begin), "band with halo");
  });
}

TEST(ExchangeHalo, RefusesAHaloWiderThanABand) {
  absl::Status s = testing::RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, Join(rank, world, port));
        ShardSpec spec = ShardSpec::ForRows(2, 5, rank, world);  // bands 2, 2, 1
        at::Tensor x = at::zeros({1, 1, spec.local_rows(), 3});
        absl::StatusOr<at::Tensor> got = ExchangeHalo(*comm, x, spec, 2);
        if (got.ok() || got.status().code() != absl::StatusCode::kFailedPrecondition) {
          return absl::InternalError("a 2-row halo over a 1-row band was not refused");
        }
        return absl::OkStatus();
      },
      absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;
}

absl::Status CheckGroupNorm(Communicator& comm, int rank, int world, at::ScalarType dtype, double offset, double atol) {
  at::manual_seed(11);
  const int64_t rows = 13;
  at::Tensor full = (at::randn({2, 8, rows, 5}, at::kDouble) + offset).to(dtype);
  at::Tensor weight = at::randn({8}, at::kDouble).to(dtype);
  at::Tensor bias = at::randn({8}, at::kDouble).to(dtype);
  at::Tensor want = at::group_norm(full, 4, weight, bias, 1e-6);
  ShardSpec spec = ShardSpec::ForRows(2, rows, rank, world);
  const Band b = spec.local_band();
  CountingCommunicator counting(comm);
  ASSIGN_OR_RETURN(at::Tensor got,
                   ShardedGroupNorm(counting, full.narrow(2, b.begin, b.size()), spec, 4, weight, bias, 1e-6));
  const int64_t calls = counting.stats().collectives();
  if (calls != (world > 1 ? 1 : 0)) return absl::InternalError(absl::StrCat("GroupNorm made ", calls, " collectives"));
  // Judged against the float64 truth of the same input: the sharded op must
  // be as accurate as the dense op (a naive E[x²]-E[x]² is not, at an offset).
  const at::Tensor truth = at::group_norm(full.to(at::kDouble), 4, weight.to(at::kDouble), bias.to(at::kDouble), 1e-6)
                               .narrow(2, b.begin, b.size());
  const double dense_error = (want.narrow(2, b.begin, b.size()).to(at::kDouble) - truth).abs().max().item<double>();
  return ExpectTensorClose(got.to(at::kDouble), truth, std::max(atol, 2 * dense_error), 0, "group norm band");
}

TEST(ShardedGroupNorm, MatchesGroupNormInFp32WithALargeMeanOffset) {
  // Central moments: E[x²]-E[x]² in fp32 would lose everything at offset 1e4.
  ForWorldSizes(
      [](Communicator& comm, int rank, int world) { return CheckGroupNorm(comm, rank, world, at::kFloat, 1e4, 1e-5); });
}

TEST(ShardedGroupNorm, MatchesGroupNormInFp64) {
  ForWorldSizes([](Communicator& comm, int rank, int world) {
    return CheckGroupNorm(comm, rank, world, at::kDouble, 1e6, 1e-9);
  });
}

TEST(ShardedGroupNorm, MatchesGroupNormInFp32) {
  ForWorldSizes(
      [](Communicator& comm, int rank, int world) { return CheckGroupNorm(comm, rank, world, at::kFloat, 0.5, 1e-5); });
}

TEST(AllGatherKV, GivesEveryRankTheGlobalKeysAndValuesInOneCollective) {
  ForWorldSizes([](Communicator& comm, int rank, int world) -> absl::Status {
    at::manual_seed(5);
    const int64_t rows = 7, width = 3;  // tokens = rows * width, bands uneven
    at::Tensor k = at::randn({2, 1, rows * width, 4});
    at::Tensor v = at::randn({2, 1, rows * width, 4});
    ShardSpec spec = ShardSpec::ForRows(0, rows, rank, world);
    std::vector<int64_t> tokens = spec.sizes();
    for (int64_t& t : tokens) t *= width;
    const Band b = spec.local_band();
    CountingCommunicator counting(comm);
    ASSIGN_OR_RETURN(auto kv, AllGatherKV(counting, k.narrow(2, b.begin * width, b.size() * width),
                                          v.narrow(2, b.begin * width, b.size() * width), tokens));
    if (counting.stats().collectives() != (world > 1 ? 1 : 0))
      return absl::InternalError("K and V took more than one collective");
    RETURN_IF_ERROR(ExpectTensorEqual(kv.first.contiguous(), k, "K"));
    return ExpectTensorEqual(kv.second.contiguous(), v, "V");
  });
}

TEST(GatherRowsToRoot, OnlyTheLeaderGetsTheWholeTensor) {
  ForWorldSizes([](Communicator& comm, int rank, int world) -> absl::Status {
    const int64_t rows = 9;
    at::Tensor full = at::arange(1 * 2 * 3 * rows * 2, at::kFloat).view({1, 2, 3, rows, 2});
    ShardSpec spec = ShardSpec::ForRows(3, rows, rank, world);
    const Band b = spec.local_band();
    ASSIGN_OR_RETURN(at::Tensor got, GatherRowsToRoot(comm, full.narrow(3, b.begin, b.size()), spec, 0));
    if (rank != 0) return got.defined() ? absl::InternalError("a peer kept the output") : absl::OkStatus();
    return ExpectTensorEqual(got, full, "gathered rows");
  });
}

}  // namespace
}  // namespace vaedecode::parallel
