#include "parallel/counting_communicator.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel {
namespace {

using ::vaedecode::parallel::testing::RunRanks;

absl::Status ExpectCounters(const OpCounters& actual, const OpCounters& expected, std::string_view what) {
  if (actual == expected) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(std::string(what), ": got {", actual.DebugString(), "}, expected {", expected.DebugString(), "}"));
}

OpCounters Counters(int64_t calls, int64_t sends, int64_t recvs, int64_t sent, int64_t received) {
  OpCounters c;
  c.calls = calls;
  c.sends = sends;
  c.recvs = recvs;
  c.bytes_sent = sent;
  c.bytes_received = received;
  return c;
}

TEST(CountingCommunicatorTest, NamesAreStable) {
  EXPECT_EQ(CallKindName(CallKind::kHalo), "halo");
  EXPECT_EQ(CallKindName(CallKind::kGroupNormStats), "group_norm_stats");
  EXPECT_EQ(CallKindName(CallKind::kAttentionKV), "attention_kv");
  EXPECT_EQ(CallKindName(CallKind::kGatherOutput), "gather_output");
  EXPECT_EQ(CallKindName(CallKind::kBroadcastJob), "broadcast_job");
  EXPECT_EQ(CallKindName(CallKind::kOther), "other");
  EXPECT_EQ(OpTypeName(OpType::kSendRecv), "send_recv");
  EXPECT_EQ(OpTypeName(OpType::kBarrier), "barrier");
}

// One decode-shaped sequence on 3 ranks with uneven bands {3, 2, 2} of
// [rows, 4] float rows (16 bytes per row), checked cell by cell on every
// rank.
TEST(CountingCommunicatorTest, ExactCountsAndBytesOnThreeRanks) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        GlooOptions options;
        options.rank = rank;
        options.world_size = world;
        options.store_port = port;
        options.timeout = absl::Seconds(10);
        auto gloo = GlooCommunicator::Create(options);
        RETURN_IF_ERROR(gloo.status());
        CountingCommunicator comm(*std::move(gloo));  // owning
        const std::vector<int64_t> sizes = {3, 2, 2};
        const int64_t row = 4 * sizeof(float);

        // Halo: interior ranks exchange 1 row with each neighbour (one
        // batch), edge ranks with their one neighbour.
        std::vector<P2POp> halo;
        for (int peer : {rank - 1, rank + 1}) {
          if (peer < 0 || peer >= world) continue;
          halo.push_back({P2POp::kSend, peer, at::ones({1, 4})});
          halo.push_back({P2POp::kRecv, peer, at::empty({1, 4})});
        }
        // Once at once, once started and waited on: the same call.
        RETURN_IF_ERROR(comm.SendRecv(halo, CallKind::kHalo));
        std::unique_ptr<PendingSendRecv> started = comm.StartSendRecv(halo, CallKind::kHalo);
        RETURN_IF_ERROR(started->Wait());
        RETURN_IF_ERROR(comm.SendRecv({}, CallKind::kHalo));  // meets nobody
        // GroupNorm stats: one all-reduce of [3] doubles.
        RETURN_IF_ERROR(comm.AllReduceSum(at::zeros({3}, at::kDouble), CallKind::kGroupNormStats));
        // Attention K/V: one uneven all-gather.
        RETURN_IF_ERROR(comm.AllGather(at::ones({sizes[rank], 4}), sizes, CallKind::kAttentionKV).status());
        // Job from the leader: 5 int64.
        RETURN_IF_ERROR(comm.Broadcast(at::zeros({5}, at::kLong), 0, CallKind::kBroadcastJob));
        // Output rows to the leader.
        RETURN_IF_ERROR(comm.GatherToRoot(at::ones({sizes[rank], 4}), sizes, 0, CallKind::kGatherOutput).status());
        RETURN_IF_ERROR(comm.Barrier());

        const CommStats stats = comm.stats();
        const int neighbours = static_cast<int>(halo.size() / 2);
        OpCounters halo_expected =
            Counters(2, 2 * neighbours, 2 * neighbours, 2 * neighbours * row, 2 * neighbours * row);
        halo_expected.local_calls = 1;
        RETURN_IF_ERROR(ExpectCounters(stats.at(CallKind::kHalo, OpType::kSendRecv), halo_expected, "halo"));
        RETURN_IF_ERROR(ExpectCounters(stats.at(CallKind::kGroupNormStats, OpType::kAllReduce),
                                       Counters(1, 0, 0, 24, 24), "group norm"));
        const int64_t others_rows = 7 - sizes[rank];
        RETURN_IF_ERROR(ExpectCounters(stats.at(CallKind::kAttentionKV, OpType::kAllGather),
                                       Counters(1, 0, 0, sizes[rank] * row, others_rows * row), "kv"));
        RETURN_IF_ERROR(ExpectCounters(stats.at(CallKind::kBroadcastJob, OpType::kBroadcast),
                                       rank == 0 ? Counters(1, 0, 0, 40, 0) : Counters(1, 0, 0, 0, 40), "job"));
        RETURN_IF_ERROR(ExpectCounters(
            stats.at(CallKind::kGatherOutput, OpType::kGather),
            rank == 0 ? Counters(1, 0, 0, 0, 4 * row) : Counters(1, 0, 0, sizes[rank] * row, 0), "output"));
        RETURN_IF_ERROR(
            ExpectCounters(stats.at(CallKind::kOther, OpType::kBarrier), Counters(1, 0, 0, 0, 0), "barrier"));
        if (stats.collectives() != 7) {
          return absl::InternalError(absl::StrCat("collectives ", stats.collectives(), ": ", stats.ToString()));
        }
        if (stats.ForOp(OpType::kSendRecv).calls != 2 || stats.ForKind(CallKind::kHalo).local_calls != 1) {
          return absl::InternalError(stats.ToString());
        }
        const std::string text = comm.ToString();
        if (!absl::StrContains(text, "calls=7 local_calls=1") || !absl::StrContains(text, "halo/send_recv: calls=2") ||
            !absl::StrContains(text, "attention_kv/all_gather: calls=1")) {
          return absl::InternalError(absl::StrCat("ToString: ", text));
        }
        // Time blocked: measured for every kind that met a peer.
        for (CallKind kind : {CallKind::kHalo, CallKind::kGroupNormStats, CallKind::kAttentionKV,
                              CallKind::kBroadcastJob, CallKind::kGatherOutput, CallKind::kOther}) {
          if (!(stats.blocked_ms[static_cast<int>(kind)] > 0)) {
            return absl::InternalError(absl::StrCat("no time blocked in ", std::string(CallKindName(kind))));
          }
        }
        comm.Reset();
        if (comm.stats().Total() != OpCounters{} || comm.stats().total_blocked_ms() != 0) {
          return absl::InternalError("Reset left counts");
        }
        return absl::OkStatus();
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(CountingCommunicatorTest, WorldSizeOneCountsNoExchangeAndNoBytes) {
  absl::Status status = RunRanks(
      1,
      [](int, int, int) -> absl::Status {
        GlooOptions options;
        options.store_host = "203.0.113.1";  // must never be contacted
        options.store_port = 1;
        auto gloo = GlooCommunicator::Create(options);
        RETURN_IF_ERROR(gloo.status());
        CountingCommunicator comm(**gloo);  // borrowing
        const at::Tensor rows = at::ones({4, 4});
        RETURN_IF_ERROR(comm.SendRecv({}, CallKind::kHalo));
        RETURN_IF_ERROR(comm.AllReduceSum(rows, CallKind::kGroupNormStats));
        RETURN_IF_ERROR(comm.AllGather(rows, {4}, CallKind::kAttentionKV).status());
        RETURN_IF_ERROR(comm.Broadcast(rows, 0, CallKind::kBroadcastJob));
        RETURN_IF_ERROR(comm.GatherToRoot(rows, {4}, 0, CallKind::kGatherOutput).status());
        RETURN_IF_ERROR(comm.Barrier());
        const OpCounters total = comm.stats().Total();
        OpCounters expected;
        expected.local_calls = 6;
        return ExpectCounters(total, expected, "world 1");
      },
      absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(CountingCommunicatorTest, FailuresAreCountedAndAbortForwarded) {
  absl::Status status = RunRanks(
      1,
      [](int, int, int) -> absl::Status {
        auto gloo = GlooCommunicator::Create(GlooOptions{});
        RETURN_IF_ERROR(gloo.status());
        CountingCommunicator comm(*std::move(gloo));
        comm.Abort("stop");
        absl::Status s = comm.Barrier();
        if (s.code() != absl::StatusCode::kUnavailable) {
          return absl::InternalError(s.ToString());
        }
        OpCounters expected;
        expected.local_calls = 1;
        expected.failures = 1;
        return ExpectCounters(comm.stats().ForOp(OpType::kBarrier), expected, "failed barrier");
      },
      absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace vaedecode::parallel
