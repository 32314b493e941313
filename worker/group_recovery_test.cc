#include "worker/group_recovery.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {
namespace {

using parallel::CallKind;
using parallel::Communicator;
using parallel::testing::RankOutcome;
using parallel::testing::RunRanksCollect;

// One rank's GroupRecovery over real Gloo on loopback, its store hosted by rank 0.
absl::StatusOr<std::unique_ptr<GroupRecovery>> MakeRecovery(int rank, int world, int port) {
  parallel::TcpStoreOptions store_options;
  store_options.port = port;
  store_options.is_master = rank == 0;
  store_options.timeout = absl::Seconds(20);
  ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, parallel::ConnectTcpStore(store_options));
  auto connect = [rank, world, store = store](const std::string& name) {
    parallel::GlooOptions options;
    options.rank = rank;
    options.world_size = world;
    options.group_name = name;
    options.store = store;
    options.timeout = absl::Seconds(20);
    return parallel::GlooCommunicator::Create(options);
  };
  return std::make_unique<GroupRecovery>(store, "t", rank, world, absl::Seconds(20), connect);
}

// Every rank's rank number, all-gathered: the communicator works.
absl::Status CheckAllGather(Communicator& comm) {
  std::vector<int64_t> sizes(comm.world_size(), 1);
  ASSIGN_OR_RETURN(at::Tensor all, comm.AllGather(at::full({1}, comm.rank(), at::kFloat), sizes, CallKind::kOther));
  if (!all.equal(at::arange(comm.world_size(), at::kFloat))) return absl::InternalError("wrong all-gather");
  return absl::OkStatus();
}

// Runs `world` ranks; rank `failing` fails its job with `failure` and aborts
// the communicator, the others learn of it in their next call; then every
// rank recovers. Returns each rank's outcome: OK with the answer's message
// in `answers`, or the recovery's error.
std::vector<RankOutcome> FailThenRecover(int world, int failing, absl::Status failure) {
  parallel::testing::RunRanksOptions options;
  options.world_size = world;
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::vector<RankOutcome>> outcomes =
      RunRanksCollect(options, [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<GroupRecovery> recovery, MakeRecovery(rank, w, port));
        ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, recovery->ConnectFirst());
        RETURN_IF_ERROR(CheckAllGather(*comm));
        absl::Status mine;
        if (rank == failing) {
          comm->Abort(std::string(failure.message()));
          mine = failure;
        } else {
          mine = CheckAllGather(*comm);  // blocked with the failing rank, then aborted
          if (mine.ok()) return absl::InternalError("the all-gather succeeded after an abort");
        }
        ASSIGN_OR_RETURN(Recovered recovered, recovery->Recover(mine, &comm));
        if (recovery->generation() != 1) return absl::InternalError("not the first re-formed generation");
        RETURN_IF_ERROR(CheckAllGather(*comm));
        // The answer travels back as this rank's outcome.
        return absl::Status(absl::StatusCode::kAborted, absl::StrCat("answer: ", recovered.answer.ToString()));
      });
  EXPECT_TRUE(outcomes.ok()) << outcomes.status();
  return outcomes.ok() ? *outcomes : std::vector<RankOutcome>{};
}

TEST(GroupRecoveryTest, AnOutOfMemoryOnOneRankReformsTheGroupAndEveryRankSaysWho) {
  const std::vector<RankOutcome> outcomes =
      FailThenRecover(3, 1, absl::ResourceExhaustedError("decode: out of memory: 4096 bytes"));
  ASSERT_EQ(outcomes.size(), 3u);
  for (const RankOutcome& o : outcomes) {
    // Every rank re-formed, all-gathered on the new communicator, and answers the same.
    EXPECT_EQ(o.status.code(), absl::StatusCode::kAborted) << "rank " << o.rank << ": " << o.status;
    EXPECT_TRUE(absl::StrContains(o.status.message(),
                                  "answer: RESOURCE_EXHAUSTED: rank 1 ran out of memory "
                                  "(decode: out of memory: 4096 bytes); the group recovered"))
        << o.status;
  }
}

TEST(GroupRecoveryTest, ARankThatFailedOtherwiseMakesEveryRankGiveUpAtOnce) {
  const std::vector<RankOutcome> outcomes = FailThenRecover(2, 1, absl::InternalError("decode failed: a bug"));
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[1].status.code(), absl::StatusCode::kUnavailable) << outcomes[1].status;
  EXPECT_EQ(outcomes[0].status.code(), absl::StatusCode::kUnavailable) << outcomes[0].status;
  EXPECT_TRUE(absl::StrContains(outcomes[0].status.message(), "rank 1 cannot recover in place: decode failed: a bug"))
      << outcomes[0].status;
  // Told by the post, not by the 20 s agreement timeout.
  for (const RankOutcome& o : outcomes) EXPECT_LT(o.elapsed, absl::Seconds(15)) << "rank " << o.rank;
}

TEST(GroupRecoveryTest, WithoutAnyRankOutOfMemoryNobodyRecovers) {
  // A transport failure every rank saw as a peer's: no rank knows the processes are sound.
  const std::vector<RankOutcome> outcomes = FailThenRecover(2, 0, absl::UnavailableError("connection reset"));
  ASSERT_EQ(outcomes.size(), 2u);
  for (const RankOutcome& o : outcomes) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kUnavailable) << o.status;
    EXPECT_TRUE(absl::StrContains(o.status.message(), "no rank of the failed job knows why")) << o.status;
  }
}

}  // namespace
}  // namespace vaedecode::worker
