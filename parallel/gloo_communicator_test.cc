#include "parallel/gloo_communicator.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/band_partition.h"
#include "parallel/store.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/free_port.h"
#include "rpc/status_macros.h"

// Every multi-rank body below runs in a forked child (see multi_process.h):
// results come back as Status, and the gtest process itself never touches a
// tensor.

namespace vaedecode::parallel {
namespace {

using ::vaedecode::parallel::testing::ExpectTensorEqual;
using ::vaedecode::parallel::testing::RunRanks;

absl::Status Expect(bool condition, std::string_view message) {
  return condition ? absl::OkStatus() : absl::InternalError(std::string(message));
}

absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank, int world, int port,
                                                      absl::Duration timeout = absl::Seconds(10),
                                                      const std::string& group = "test") {
  GlooOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store_port = port;
  options.group_name = group;
  options.timeout = timeout;
  return GlooCommunicator::Create(options);
}

// The rows rank `rank` contributes: distinct values per rank and row.
at::Tensor Piece(int rank, int64_t rows, at::ScalarType type = at::kFloat) {
  return (at::arange(rows * 6, at::kDouble).reshape({rows, 2, 3}) + 1000.0 * (rank + 1)).to(type);
}

at::Tensor ExpectedGather(absl::Span<const int64_t> sizes, at::ScalarType type = at::kFloat) {
  std::vector<at::Tensor> pieces;
  for (size_t r = 0; r < sizes.size(); ++r) {
    pieces.push_back(Piece(static_cast<int>(r), sizes[r], type));
  }
  return at::cat(pieces, 0);
}

std::string What(const std::string& op, int rank, int world) { return absl::StrCat(op, " rank ", rank, "/", world); }

TEST(GlooCommunicatorTest, SendRecvRingBothDirectionsInOneBatch) {
  for (int world = 2; world <= 4; ++world) {
    absl::Status status = RunRanks(
        world,
        [](int rank, int world, int port) -> absl::Status {
          auto comm = Connect(rank, world, port);
          RETURN_IF_ERROR(comm.status());
          const int next = (rank + 1) % world;
          const int prev = (rank + world - 1) % world;
          // The "up" message is a non-contiguous view: sends may be any layout.
          const at::Tensor up = at::full({3, 2}, rank * 10.0 + 1).t();
          const at::Tensor down = at::full({2, 3}, rank * 10.0 + 2);
          at::Tensor from_prev = at::empty({2, 3});
          at::Tensor from_next = at::empty({2, 3});
          const std::vector<P2POp> ops = {
              {P2POp::kSend, next, up},
              {P2POp::kSend, prev, down},
              {P2POp::kRecv, prev, from_prev},
              {P2POp::kRecv, next, from_next},
          };
          RETURN_IF_ERROR((*comm)->SendRecv(ops, CallKind::kHalo));
          RETURN_IF_ERROR(ExpectTensorEqual(from_prev, at::full({2, 3}, prev * 10.0 + 1), "from prev"));
          RETURN_IF_ERROR(ExpectTensorEqual(from_next, at::full({2, 3}, next * 10.0 + 2), "from next"));
          // An empty batch (a rank with nothing to exchange) is fine, and
          // the per-pair message order survives it.
          RETURN_IF_ERROR((*comm)->SendRecv({}, CallKind::kHalo));
          RETURN_IF_ERROR((*comm)->SendRecv(ops, CallKind::kHalo));
          return ExpectTensorEqual(from_next, at::full({2, 3}, next * 10.0 + 2), "again from next");
        },
        absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << "world " << world << ": " << status;
  }
}

TEST(GlooCommunicatorTest, OnlyNeighboursExchangeWhileOthersWait) {
  // Ranks 0 and 1 exchange twice, rank 2 sits out the first exchange
  // entirely; per-pair tags keep the later exchange with rank 2 aligned.
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port);
        RETURN_IF_ERROR(comm.status());
        if (rank < 2) {
          at::Tensor in = at::empty({4});
          RETURN_IF_ERROR((*comm)->SendRecv(
              {{P2POp::kSend, 1 - rank, at::full({4}, 7.0 + rank)}, {P2POp::kRecv, 1 - rank, in}}, CallKind::kHalo));
          RETURN_IF_ERROR(ExpectTensorEqual(in, at::full({4}, 7.0 + (1 - rank)), "pair"));
        }
        // Rank 2 receives from both; both send to it.
        if (rank == 2) {
          at::Tensor a = at::empty({2}), b = at::empty({2});
          RETURN_IF_ERROR((*comm)->SendRecv({{P2POp::kRecv, 0, a}, {P2POp::kRecv, 1, b}}, CallKind::kHalo));
          RETURN_IF_ERROR(ExpectTensorEqual(a, at::full({2}, 100.0), "from 0"));
          return ExpectTensorEqual(b, at::full({2}, 101.0), "from 1");
        }
        return (*comm)->SendRecv({{P2POp::kSend, 2, at::full({2}, 100.0 + rank)}}, CallKind::kHalo);
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

// A file the ranks of one test share (they are forked children).
std::string SharedFlag(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, "_", ::getppid());
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::ifstream(path).good()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(GlooCommunicatorTest, StartedSendRecvReturnsBeforeThePeerPostsAndWaitDelivers) {
  // Rank 0 starts its batch, then tells rank 1 (through a file) to post its
  // own: a start that waited for the peer would never get to tell it.
  for (int world = 2; world <= 3; ++world) {
    const std::string flag = SharedFlag(absl::StrCat("started_", world));
    std::remove(flag.c_str());
    absl::Status status = RunRanks(
        world,
        [&flag](int rank, int world, int port) -> absl::Status {
          auto comm = Connect(rank, world, port);
          RETURN_IF_ERROR(comm.status());
          const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
          at::Tensor from_prev = at::empty({64, 3});
          std::vector<P2POp> ops = {{P2POp::kSend, next, at::full({64, 3}, rank + 1.0)},
                                    {P2POp::kRecv, prev, from_prev}};
          if (rank != 0 && !WaitForFile(flag, absl::Seconds(10))) {
            return absl::InternalError("rank 0's start did not return while its peers had not posted");
          }
          std::unique_ptr<PendingSendRecv> pending = (*comm)->StartSendRecv(ops, CallKind::kHalo);
          if (rank == 0) std::ofstream(flag) << "started";
          // Compute on other tensors while the rows travel.
          const at::Tensor busy = at::randn({128, 128}).matmul(at::randn({128, 128}));
          RETURN_IF_ERROR(pending->Wait());
          RETURN_IF_ERROR(ExpectTensorEqual(from_prev, at::full({64, 3}, prev + 1.0), "from prev"));
          // The per-pair order carries on into plain calls.
          at::Tensor again = at::empty({2});
          RETURN_IF_ERROR((*comm)->SendRecv(
              {{P2POp::kSend, next, at::full({2}, 9.0 + rank)}, {P2POp::kRecv, prev, again}}, CallKind::kHalo));
          return ExpectTensorEqual(again, at::full({2}, 9.0 + prev), "again");
        },
        absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << "world " << world << ": " << status;
    std::remove(flag.c_str());
  }
}

TEST(GlooCommunicatorTest, AStartedSendRecvNeverWaitedOnAbortsTheGroup) {
  absl::Status status = RunRanks(
      2,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port);
        RETURN_IF_ERROR(comm.status());
        RETURN_IF_ERROR((*comm)->Barrier());
        const int peer = 1 - rank;
        if (rank == 0) {
          // E.g. the compute between start and wait threw.
          (void)(*comm)->StartSendRecv({{P2POp::kSend, peer, at::ones({4})}}, CallKind::kHalo);
          absl::Status after = (*comm)->Barrier();
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rank 1 learns it from the store
          return Expect(after.code() == absl::StatusCode::kUnavailable, after.ToString());
        }
        at::Tensor in = at::empty({4});
        (void)(*comm)->SendRecv({{P2POp::kRecv, peer, in}}, CallKind::kHalo);
        absl::Status after = (*comm)->Barrier();
        return Expect(after.code() == absl::StatusCode::kUnavailable &&
                          absl::StrContains(after.message(), "abandoned before its wait"),
                      after.ToString());
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

class GlooAllGatherTest : public ::testing::TestWithParam<GlooAllGather> {};

TEST_P(GlooAllGatherTest, UnevenAllGatherEqualsConcatenation) {
  const GlooAllGather algorithm = GetParam();
  for (int world = 1; world <= 4; ++world) {
    absl::Status status = RunRanks(
        world,
        [algorithm](int rank, int world, int port) -> absl::Status {
          GlooOptions options;
          options.rank = rank;
          options.world_size = world;
          options.store_port = port;
          options.timeout = absl::Seconds(10);
          options.all_gather = algorithm;
          auto comm = GlooCommunicator::Create(options);
          RETURN_IF_ERROR(comm.status());
          // 7 rows: {7}, {4,3}, {3,2,2}, {2,2,2,1}; then 2 rows, which
          // leaves empty bands at world 3 and 4; then a bf16 gather.
          for (int64_t rows : {7, 2}) {
            const std::vector<int64_t> sizes = ShardSpec::ForRows(0, rows, rank, world).sizes();
            absl::StatusOr<at::Tensor> gathered =
                (*comm)->AllGather(Piece(rank, sizes[rank]), sizes, CallKind::kAttentionKV);
            RETURN_IF_ERROR(gathered.status());
            RETURN_IF_ERROR(Expect(gathered->is_contiguous(), "not contiguous"));
            RETURN_IF_ERROR(ExpectTensorEqual(*gathered, ExpectedGather(sizes), What("AllGather", rank, world)));
          }
          const std::vector<int64_t> sizes = {3, 2, 2, 1};
          const absl::Span<const int64_t> used(sizes.data(), world);
          absl::StatusOr<at::Tensor> bf16 =
              (*comm)->AllGather(Piece(rank, used[rank], at::kBFloat16), used, CallKind::kOther);
          RETURN_IF_ERROR(bf16.status());
          return ExpectTensorEqual(*bf16, ExpectedGather(used, at::kBFloat16), What("AllGather bf16", rank, world));
        },
        absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << "world " << world << ": " << status;
  }
}

INSTANTIATE_TEST_SUITE_P(PointToPointAndNative, GlooAllGatherTest,
                         ::testing::Values(GlooAllGather::kPointToPoint, GlooAllGather::kNative));

TEST(GlooCommunicatorTest, AllReduceSumInPlace) {
  for (int world = 1; world <= 3; ++world) {
    absl::Status status = RunRanks(
        world,
        [](int rank, int world, int port) -> absl::Status {
          auto comm = Connect(rank, world, port);
          RETURN_IF_ERROR(comm.status());
          const double factor = world * (world + 1) / 2.0;  // sum of rank + 1
          const at::Tensor base = at::arange(15, at::kFloat).reshape({5, 3});
          at::Tensor values = base * (rank + 1);
          RETURN_IF_ERROR((*comm)->AllReduceSum(values, CallKind::kGroupNormStats));
          RETURN_IF_ERROR(ExpectTensorEqual(values, base * factor, "float"));
          // A non-contiguous view is reduced into its own storage.
          at::Tensor storage = (base * (rank + 1)).clone();
          RETURN_IF_ERROR((*comm)->AllReduceSum(storage.t(), CallKind::kOther));
          RETURN_IF_ERROR(ExpectTensorEqual(storage, base * factor, "view"));
          at::Tensor bf16 = (base * (rank + 1)).to(at::kBFloat16);
          RETURN_IF_ERROR((*comm)->AllReduceSum(bf16, CallKind::kOther));
          RETURN_IF_ERROR(ExpectTensorEqual(bf16, (base * factor).to(at::kBFloat16), "bf16"));
          at::Tensor ints = at::full({4}, int64_t{rank + 1}, at::kLong);
          RETURN_IF_ERROR((*comm)->AllReduceSum(ints, CallKind::kOther));
          return ExpectTensorEqual(ints, at::full({4}, static_cast<int64_t>(factor), at::kLong), "int64");
        },
        absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << "world " << world << ": " << status;
  }
}

TEST(GlooCommunicatorTest, BroadcastFromAnyRoot) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port);
        RETURN_IF_ERROR(comm.status());
        for (int root = 0; root < world; ++root) {
          const at::Tensor expected = at::arange(12, at::kLong).reshape({3, 4}) * (root + 1);
          at::Tensor job = rank == root ? expected.clone() : at::zeros({3, 4}, at::kLong);
          RETURN_IF_ERROR((*comm)->Broadcast(job, root, CallKind::kBroadcastJob));
          RETURN_IF_ERROR(ExpectTensorEqual(job, expected, "broadcast"));
        }
        // In place into a non-contiguous view.
        at::Tensor storage = rank == 1 ? at::arange(6, at::kFloat).reshape({2, 3}) : at::zeros({2, 3});
        RETURN_IF_ERROR((*comm)->Broadcast(storage.t(), 1, CallKind::kOther));
        return ExpectTensorEqual(storage, at::arange(6, at::kFloat).reshape({2, 3}), "view");
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, GatherToRootOnlyRootGetsRows) {
  for (int world = 1; world <= 4; ++world) {
    absl::Status status = RunRanks(
        world,
        [](int rank, int world, int port) -> absl::Status {
          auto comm = Connect(rank, world, port);
          RETURN_IF_ERROR(comm.status());
          const std::vector<int64_t> sizes = ShardSpec::ForRows(0, 7, rank, world).sizes();
          for (int root : {0, world - 1}) {
            absl::StatusOr<at::Tensor> rows =
                (*comm)->GatherToRoot(Piece(rank, sizes[rank]), sizes, root, CallKind::kGatherOutput);
            RETURN_IF_ERROR(rows.status());
            if (rank != root) {
              RETURN_IF_ERROR(Expect(!rows->defined(), "peer got rows"));
              continue;
            }
            RETURN_IF_ERROR(ExpectTensorEqual(*rows, ExpectedGather(sizes), What("GatherToRoot", rank, world)));
          }
          return absl::OkStatus();
        },
        absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << "world " << world << ": " << status;
  }
}

TEST(GlooCommunicatorTest, BarrierWaitsForTheSlowestRank) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port);
        RETURN_IF_ERROR(comm.status());
        RETURN_IF_ERROR((*comm)->Barrier());
        const absl::Time start = absl::Now();
        std::this_thread::sleep_for(std::chrono::milliseconds(150 * rank));
        RETURN_IF_ERROR((*comm)->Barrier());
        const absl::Duration waited = absl::Now() - start;
        return Expect(waited >= absl::Milliseconds(280),
                      absl::StrCat("rank ", rank, " left the barrier after ", absl::FormatDuration(waited)));
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, WorldSizeOneNeedsNoStoreOrPeer) {
  absl::Status status = RunRanks(
      1,
      [](int, int, int) -> absl::Status {
        GlooOptions options;
        // An unroutable address: any connection attempt would hang or fail.
        options.store_host = "203.0.113.1";
        options.store_port = 1;
        options.timeout = absl::Seconds(30);
        const absl::Time start = absl::Now();
        auto comm = GlooCommunicator::Create(options);
        RETURN_IF_ERROR(comm.status());
        const at::Tensor local = Piece(0, 4);
        absl::StatusOr<at::Tensor> all = (*comm)->AllGather(local, {4}, CallKind::kAttentionKV);
        RETURN_IF_ERROR(all.status());
        RETURN_IF_ERROR(ExpectTensorEqual(*all, local, "gather"));
        at::Tensor sum = local.clone();
        RETURN_IF_ERROR((*comm)->AllReduceSum(sum, CallKind::kGroupNormStats));
        RETURN_IF_ERROR(ExpectTensorEqual(sum, local, "all-reduce"));
        RETURN_IF_ERROR((*comm)->Broadcast(sum, 0, CallKind::kBroadcastJob));
        absl::StatusOr<at::Tensor> rows = (*comm)->GatherToRoot(local, {4}, 0, CallKind::kGatherOutput);
        RETURN_IF_ERROR(rows.status());
        RETURN_IF_ERROR(ExpectTensorEqual(*rows, local, "gather to root"));
        RETURN_IF_ERROR((*comm)->SendRecv({}, CallKind::kHalo));
        RETURN_IF_ERROR((*comm)->Barrier());
        return Expect(absl::Now() - start < absl::Seconds(2), "too slow");
      },
      absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, InvalidArgumentsFailAndAbort) {
  absl::Status status = RunRanks(
      1,
      [](int, int, int) -> absl::Status {
        auto comm = GlooCommunicator::Create(GlooOptions{});
        RETURN_IF_ERROR(comm.status());
        absl::StatusOr<at::Tensor> wrong = (*comm)->AllGather(Piece(0, 3), {4}, CallKind::kOther);
        RETURN_IF_ERROR(Expect(wrong.status().code() == absl::StatusCode::kInvalidArgument, wrong.status().ToString()));
        // Fail-stop: the communicator is aborted from now on.
        absl::Status after = (*comm)->Barrier();
        return Expect(after.code() == absl::StatusCode::kUnavailable && absl::StrContains(after.message(), "aborted"),
                      after.ToString());
      },
      absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status;

  GlooOptions bad;
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_EQ(GlooCommunicator::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.rank = 1;
  bad.store_port = 0;  // world size 2 needs a real port
  EXPECT_EQ(GlooCommunicator::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooCommunicatorTest, PeerThatNeverJoinsIsNamedWithinTheTimeout) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        if (rank == 2) return absl::OkStatus();  // never joins
        const absl::Time start = absl::Now();
        auto comm = Connect(rank, world, port, absl::Seconds(2));
        const absl::Duration took = absl::Now() - start;
        RETURN_IF_ERROR(Expect(!comm.ok(), "joined without rank 2"));
        RETURN_IF_ERROR(Expect(took < absl::Seconds(4), absl::StrCat("took ", absl::FormatDuration(took))));
        RETURN_IF_ERROR(Expect(comm.status().code() == absl::StatusCode::kDeadlineExceeded ||
                                   comm.status().code() == absl::StatusCode::kUnavailable,
                               comm.status().ToString()));
        // Rank 0 hosts the store, so it can always name the missing rank.
        if (rank == 0) {
          RETURN_IF_ERROR(
              Expect(absl::StrContains(comm.status().message(), "rank(s) 2 of 3"), comm.status().ToString()));
        }
        return absl::OkStatus();
      },
      absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, PeerThatExitsMakesOthersFailFast) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        const absl::Duration timeout = absl::Seconds(5);
        auto comm = Connect(rank, world, port, timeout);
        RETURN_IF_ERROR(comm.status());
        RETURN_IF_ERROR((*comm)->Barrier());
        if (rank == 2) {
          // Let the barrier finish everywhere, then leave: the process exits
          // and its connections close.
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          return absl::OkStatus();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        const std::vector<int64_t> sizes = {2, 2, 2};
        const absl::Time start = absl::Now();
        absl::StatusOr<at::Tensor> all = (*comm)->AllGather(Piece(rank, 2), sizes, CallKind::kAttentionKV);
        const absl::Duration took = absl::Now() - start;
        RETURN_IF_ERROR(Expect(!all.ok(), "gathered from a dead rank"));
        RETURN_IF_ERROR(Expect(all.status().code() == absl::StatusCode::kUnavailable ||
                                   all.status().code() == absl::StatusCode::kDeadlineExceeded,
                               all.status().ToString()));
        RETURN_IF_ERROR(Expect(took < timeout + absl::Seconds(1), absl::StrCat("took ", absl::FormatDuration(took))));
        // Later calls fail at once.
        const absl::Time again = absl::Now();
        absl::Status next = (*comm)->Barrier();
        return Expect(!next.ok() && absl::Now() - again < absl::Milliseconds(100), next.ToString());
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, PeerGoneDuringALargeSendDoesNotKillTheSender) {
  // A receiver that dies mid-transfer resets the connection under the
  // sender's writes: that must surface as an error, not as a SIGPIPE that
  // kills the surviving rank.
  absl::Status status = RunRanks(
      2,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port, absl::Seconds(3));
        RETURN_IF_ERROR(comm.status());
        const int64_t elements = int64_t{64} << 20;  // 256 MiB of float
        // Buffers first, so the transfer starts right after the barrier.
        const at::Tensor big = rank == 0 ? at::ones({elements}) : at::empty({elements});
        RETURN_IF_ERROR((*comm)->Barrier());
        if (rank == 1) {
          std::thread receiver([&comm, &big] { (void)(*comm)->SendRecv({{P2POp::kRecv, 0, big}}, CallKind::kOther); });
          receiver.detach();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          ::_exit(0);  // mid-transfer, unread data in the socket
        }
        // Gloo does not always fail a send whose receiver died after posting
        // its receive; the call deadline bounds it then.
        absl::Status sent = (*comm)->SendRecv({{P2POp::kSend, 1, big}}, CallKind::kOther);
        return Expect(
            sent.code() == absl::StatusCode::kUnavailable || sent.code() == absl::StatusCode::kDeadlineExceeded,
            sent.ToString());
      },
      absl::Seconds(30));
  // Rank 1 reports nothing (it _exit()s): only rank 0's fate matters.
  EXPECT_FALSE(absl::StrContains(status.message(), "rank 0")) << status;
}

TEST(GlooCommunicatorTest, AbortOnOneRankReachesBlockedAndLaterCalls) {
  absl::Status status = RunRanks(
      3,
      [](int rank, int world, int port) -> absl::Status {
        auto comm = Connect(rank, world, port, absl::Seconds(10));
        RETURN_IF_ERROR(comm.status());
        RETURN_IF_ERROR((*comm)->Barrier());
        const absl::Time joined = absl::Now();
        // Ranks 0 and 1 stay alive until rank 2 is done, so that rank 2 learns
        // of the abort from the store, not from closed connections.
        auto linger = [joined] {
          std::this_thread::sleep_until(absl::ToChronoTime(joined + absl::Milliseconds(2000)));
        };
        const std::vector<int64_t> sizes = {1, 1, 1};
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          (*comm)->Abort("decoder failed on rank 1");
          absl::Status after = (*comm)->Barrier();
          linger();
          return Expect(after.code() == absl::StatusCode::kUnavailable, after.ToString());
        }
        if (rank == 2) {
          // Arrives after the abort; must not wait for the 10 s timeout.
          std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        }
        const absl::Time start = absl::Now();
        absl::StatusOr<at::Tensor> all = (*comm)->AllGather(Piece(rank, 1), sizes, CallKind::kAttentionKV);
        const absl::Duration took = absl::Now() - start;
        if (rank == 0) linger();
        RETURN_IF_ERROR(Expect(all.status().code() == absl::StatusCode::kUnavailable &&
                                   absl::StrContains(all.status().message(), "rank 1: decoder failed on rank 1"),
                               all.status().ToString()));
        return Expect(took < absl::Milliseconds(800),
                      absl::StrCat("rank ", rank, " took ", absl::FormatDuration(took)));
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, HungPeerGivesDeadlineExceeded) {
  absl::Status status = RunRanks(
      2,
      [](int rank, int world, int port) -> absl::Status {
        const absl::Duration timeout = absl::Seconds(1);
        auto comm = Connect(rank, world, port, timeout);
        RETURN_IF_ERROR(comm.status());
        RETURN_IF_ERROR((*comm)->Barrier());
        if (rank == 1) {
          // Joined but stuck; by the time it calls, rank 0 has given up.
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          absl::Status late = (*comm)->SendRecv({{P2POp::kSend, 0, at::ones({4})}}, CallKind::kHalo);
          return Expect(!late.ok(), "late send succeeded");
        }
        const absl::Time start = absl::Now();
        at::Tensor stats = at::ones({8});
        absl::Status reduced = (*comm)->AllReduceSum(stats, CallKind::kGroupNormStats);
        const absl::Duration took = absl::Now() - start;
        RETURN_IF_ERROR(Expect(reduced.code() == absl::StatusCode::kDeadlineExceeded, reduced.ToString()));
        RETURN_IF_ERROR(Expect(took >= absl::Milliseconds(900) && took < absl::Seconds(2),
                               absl::StrCat("took ", absl::FormatDuration(took))));
        // Fail-stop: the next call fails at once.
        const absl::Time again = absl::Now();
        absl::Status next = (*comm)->SendRecv({{P2POp::kRecv, 1, at::empty({4})}}, CallKind::kHalo);
        return Expect(next.code() == absl::StatusCode::kUnavailable && absl::Now() - again < absl::Milliseconds(100),
                      next.ToString());
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCommunicatorTest, GroupsSharingAStoreDoNotInterfere) {
  absl::Status status = RunRanks(
      3,
      [](int process, int world, int port) -> absl::Status {
        TcpStoreOptions store_options;
        store_options.port = port;
        store_options.is_master = process == 0;
        store_options.timeout = absl::Seconds(10);
        absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store = ConnectTcpStore(store_options);
        RETURN_IF_ERROR(store.status());
        // Same processes, two groups, ranks in opposite orders.
        GlooOptions alpha_options;
        alpha_options.rank = process;
        alpha_options.world_size = world;
        alpha_options.group_name = "alpha";
        alpha_options.store = *store;
        alpha_options.timeout = absl::Seconds(10);
        GlooOptions beta_options = alpha_options;
        beta_options.rank = world - 1 - process;
        beta_options.group_name = "beta";
        auto alpha = GlooCommunicator::Create(alpha_options);
        RETURN_IF_ERROR(alpha.status());
        auto beta = GlooCommunicator::Create(beta_options);
        RETURN_IF_ERROR(beta.status());

        const std::vector<int64_t> sizes = {3, 2, 2};
        for (int round = 0; round < 2; ++round) {
          const int a = (*alpha)->rank();
          const int b = (*beta)->rank();
          absl::StatusOr<at::Tensor> ga = (*alpha)->AllGather(Piece(a, sizes[a]), sizes, CallKind::kOther);
          RETURN_IF_ERROR(ga.status());
          absl::StatusOr<at::Tensor> gb = (*beta)->AllGather(Piece(b, sizes[b]) * -1, sizes, CallKind::kOther);
          RETURN_IF_ERROR(gb.status());
          RETURN_IF_ERROR(ExpectTensorEqual(*ga, ExpectedGather(sizes), "alpha"));
          RETURN_IF_ERROR(ExpectTensorEqual(*gb, ExpectedGather(sizes) * -1, "beta"));
          at::Tensor sa = at::full({2}, a + 1.0);
          at::Tensor sb = at::full({2}, 10.0 * (b + 1));
          RETURN_IF_ERROR((*beta)->AllReduceSum(sb, CallKind::kOther));
          RETURN_IF_ERROR((*alpha)->AllReduceSum(sa, CallKind::kOther));
          RETURN_IF_ERROR(ExpectTensorEqual(sa, at::full({2}, 6.0), "alpha sum"));
          RETURN_IF_ERROR(ExpectTensorEqual(sb, at::full({2}, 60.0), "beta sum"));
        }
        // Aborting one group leaves the other working.
        if (process == 0) (*alpha)->Abort("alpha only");
        RETURN_IF_ERROR((*beta)->Barrier());
        absl::Status alpha_after = (*alpha)->Barrier();
        return Expect(alpha_after.code() == absl::StatusCode::kUnavailable, alpha_after.ToString());
      },
      absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(StoreTest, AReservedPortIsKeptFromOthersButNotFromTheStore) {
  absl::StatusOr<rpc::ReservedPort> reserved = rpc::ReservedPort::Take();
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  const int port = reserved->port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  // Another socket cannot bind it while it is reserved...
  const int other = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(other, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_NE(::bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(other);
  // ...but the store's master binds it and serves a client.
  TcpStoreOptions master;
  master.port = port;
  master.is_master = true;
  master.timeout = absl::Seconds(5);
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store = ConnectTcpStore(master);
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->set("k", std::vector<uint8_t>{3});
  TcpStoreOptions client = master;
  client.is_master = false;
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> connected = ConnectTcpStore(client);
  ASSERT_TRUE(connected.ok()) << connected.status();
  EXPECT_EQ((*connected)->get("k"), std::vector<uint8_t>{3});
}

TEST(StoreTest, PortZeroIsRefused) {
  TcpStoreOptions options;
  options.port = 0;
  EXPECT_EQ(ConnectTcpStore(options).status().code(), absl::StatusCode::kInvalidArgument);
}

// The local addresses (hex, as /proc/net/tcp writes them: 0100007F is
// 127.0.0.1) of the IPv4 and IPv6 sockets listening on `port`.
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> found;
  const std::string port_hex = absl::StrCat(":", absl::Hex(port, absl::kZeroPad4));
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state != "0A") continue;  // LISTEN
      if (absl::EndsWithIgnoreCase(local, port_hex)) {
        found.push_back(local.substr(0, local.size() - port_hex.size()));
      }
    }
  }
  return found;
}

TEST(StoreTest, TheMasterListensOnItsHostOnly) {
  absl::StatusOr<rpc::ReservedPort> reserved = rpc::ReservedPort::Take();
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  const absl::StatusOr<int> port = reserved->port();
  TcpStoreOptions options;
  options.port = *port;
  options.is_master = true;
  options.timeout = absl::Seconds(5);
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store = ConnectTcpStore(options);
  ASSERT_TRUE(store.ok()) << store.status();
  // c10d on its own listens on every interface (0.0.0.0 / ::).
  EXPECT_EQ(ListeningAddresses(*port), std::vector<std::string>{"0100007F"});
  // And it still works: a client on loopback connects and reads a key.
  (*store)->set("k", std::vector<uint8_t>{7});
  options.is_master = false;
  absl::StatusOr<c10::intrusive_ptr<c10d::Store>> client = ConnectTcpStore(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->get("k"), std::vector<uint8_t>{7});

  options.host = "localhost";  // a name cannot be bound exactly
  options.is_master = true;
  EXPECT_EQ(ConnectTcpStore(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::parallel
