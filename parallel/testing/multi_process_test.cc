#include "parallel/testing/multi_process.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vaedecode::parallel::testing {
namespace {

RunRanksOptions Options(int world_size, absl::Duration timeout) {
  RunRanksOptions options;
  options.world_size = world_size;
  options.timeout = timeout;
  return options;
}

TEST(RunRanksTest, EveryRankRunsOnceWithItsRankAndThePort) {
  // Each child reports its arguments; a rank mismatch makes it fail.
  absl::Status status = RunRanks(
      4,
      [](int rank, int world, int port) -> absl::Status {
        if (world != 4) return absl::InternalError("wrong world size");
        if (port <= 0 || port > 65535) return absl::InternalError("bad port");
        if (rank < 0 || rank >= 4) return absl::InternalError("bad rank");
        return absl::OkStatus();
      },
      absl::Seconds(10));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(RunRanksTest, ReportsEveryFailedRankWithItsStatus) {
  absl::StatusOr<std::vector<RankOutcome>> outcomes =
      RunRanksCollect(Options(3, absl::Seconds(10)), [](int rank, int, int) -> absl::Status {
        if (rank == 0) return absl::OkStatus();
        return absl::UnavailableError(absl::StrCat("rank ", rank, " says no"));
      });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  ASSERT_EQ(outcomes->size(), 3u);
  EXPECT_TRUE((*outcomes)[0].status.ok());
  EXPECT_EQ((*outcomes)[1].status, absl::UnavailableError("rank 1 says no"));
  EXPECT_EQ((*outcomes)[2].status, absl::UnavailableError("rank 2 says no"));

  absl::Status status = RunRanks(
      3,
      [](int rank, int, int) -> absl::Status {
        if (rank == 0) return absl::OkStatus();
        return absl::UnavailableError(absl::StrCat("rank ", rank, " says no"));
      },
      absl::Seconds(10));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(status.message(), "2 of 3 ranks failed")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "rank 1: UNAVAILABLE: rank 1 says no")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "rank 2: UNAVAILABLE: rank 2 says no")) << status;
}

TEST(RunRanksTest, CrashesAndExceptionsAreReported) {
  absl::StatusOr<std::vector<RankOutcome>> outcomes =
      RunRanksCollect(Options(4, absl::Seconds(10)), [](int rank, int, int) -> absl::Status {
        switch (rank) {
          case 0:
            throw std::runtime_error("boom");
          case 1:
            std::abort();
          case 2:
            ::_exit(7);
          default:
            return absl::OkStatus();
        }
      });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  EXPECT_EQ((*outcomes)[0].status, absl::InternalError("uncaught exception: boom"));
  EXPECT_EQ((*outcomes)[1].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains((*outcomes)[1].status.message(), absl::StrCat("signal ", SIGABRT)))
      << (*outcomes)[1].status;
  EXPECT_EQ((*outcomes)[2].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains((*outcomes)[2].status.message(), "exited with code 7 without reporting"))
      << (*outcomes)[2].status;
  EXPECT_TRUE((*outcomes)[3].status.ok());
}

bool ProcessExists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST(RunRanksTest, TimeoutKillsHungRanksAndTheirHelpersAndLeavesNoOrphans) {
  // Each hung rank forks a helper and reports both pids through a file, so
  // the test can check afterwards that nothing survived.
  const std::string dir = std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string pid_file = absl::StrCat(dir, "/hung_pids_", ::getpid());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<RankOutcome>> outcomes =
      RunRanksCollect(Options(3, absl::Seconds(1)), [&pid_file](int rank, int, int) -> absl::Status {
        if (rank == 0) return absl::OkStatus();
        const pid_t helper = ::fork();
        if (helper == 0) {
          while (true) ::pause();
        }
        {
          std::ofstream out(absl::StrCat(pid_file, "_", rank));
          out << ::getpid() << " " << helper << "\n";
        }
        while (true) ::pause();
      });
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  EXPECT_LT(elapsed, absl::Seconds(5));
  EXPECT_TRUE((*outcomes)[0].status.ok());
  EXPECT_FALSE((*outcomes)[0].timed_out);
  for (int rank = 1; rank < 3; ++rank) {
    EXPECT_TRUE((*outcomes)[rank].timed_out);
    EXPECT_EQ((*outcomes)[rank].status.code(), absl::StatusCode::kDeadlineExceeded);
    std::ifstream in(absl::StrCat(pid_file, "_", rank));
    pid_t child = 0, helper = 0;
    ASSERT_TRUE(in >> child >> helper) << "rank " << rank << " wrote no pids";
    EXPECT_FALSE(ProcessExists(child)) << "rank " << rank << " survived";
    // The helper was reparented (not our child): give init a moment to reap.
    bool helper_gone = false;
    for (int i = 0; i < 100 && !helper_gone; ++i) {
      helper_gone = !ProcessExists(helper);
      if (!helper_gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!helper_gone) {
      // A zombie is dead; only a running process is an orphan.
      std::ifstream stat(absl::StrCat("/proc/", helper, "/stat"));
      std::string pid_field, comm, state;
      stat >> pid_field >> comm >> state;
      EXPECT_EQ(state, "Z") << "helper of rank " << rank << " survived";
    }
  }

  absl::Status status = RunRanks(
      2,
      [](int rank, int, int) -> absl::Status {
        if (rank == 1) {
          while (true) ::pause();
        }
        return absl::OkStatus();
      },
      absl::Milliseconds(500));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "rank 1: DEADLINE_EXCEEDED")) << status;
}

TEST(RunRanksTest, LargeReportsDoNotBlock) {
  absl::StatusOr<std::vector<RankOutcome>> outcomes = RunRanksCollect(
      Options(2, absl::Seconds(10)),
      [](int rank, int, int) -> absl::Status { return absl::InternalError(std::string(1 << 20, 'a' + rank)); });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  EXPECT_EQ((*outcomes)[0].status.message().size(), size_t{1} << 20);
  EXPECT_EQ((*outcomes)[1].status.message()[0], 'b');
}

TEST(RunRanksTest, RejectsEmptyWorld) {
  EXPECT_EQ(RunRanks(
                0, [](int, int, int) { return absl::OkStatus(); }, absl::Seconds(1))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::parallel::testing
