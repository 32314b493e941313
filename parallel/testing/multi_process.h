#pragma once

// Runs one test body per rank in forked child processes, for tests of
// communicators and sharded operators over real Gloo on loopback.
//
// Rules for bodies (they run in the child, after fork):
//  * Report through the returned Status, never through gtest assertions:
//    the child never returns to gtest (it _exit()s), so EXPECT_/ASSERT_
//    failures there are lost. Build expected tensors and compare inside the
//    body (parallel/testing/tensor_checks.h) and return an error on mismatch.
//  * Keep the parent (the gtest process) free of LibTorch work before calling
//    RunRanks: no tensor ops, no communicators. Forking after LibTorch has
//    started its OpenMP / intra-op thread pool can deadlock the child (the
//    pool's threads do not exist there). The child sets the intra-op thread
//    count to 1 before the body (RunRanksOptions::child_intra_op_threads),
//    which keeps ATen's parallel_for inline even so.
//  * Exceptions escaping the body are caught and reported as INTERNAL.
//
// Process hygiene: each child leads its own process group (killed as a group,
// so its helpers die with it) and gets SIGKILL if the parent dies, so no
// child outlives a test. On timeout every child still running is killed and
// reaped before RunRanks returns.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vaedecode::parallel::testing {

// body(rank, world_size, store_port): store_port is a loopback port the
// parent holds reserved (rpc::ReservedPort) for the group's TCPStore until
// every rank has exited; rank 0 hosts the store on it.
using RankBody = std::function<absl::Status(int rank, int world_size, int store_port)>;

struct RunRanksOptions {
  int world_size = 2;
  // Wall-clock limit for all ranks together; children still running then
  // are killed.
  absl::Duration timeout = absl::Seconds(30);
  // at::set_num_threads in each child before the body; 0 leaves it alone.
  int child_intra_op_threads = 1;
};

struct RankOutcome {
  int rank = 0;
  // The body's status; or INTERNAL (crash, signal, exception, no report) /
  // DEADLINE_EXCEEDED (killed at the timeout) describing what happened.
  absl::Status status;
  // Time from fork to the child's exit as seen by the parent.
  absl::Duration elapsed;
  // The child was still running at the timeout and was killed.
  bool timed_out = false;
};

// Runs `body` once per rank and returns every rank's outcome, in rank order.
// Fails only if the processes could not be started (then no child is left).
absl::StatusOr<std::vector<RankOutcome>> RunRanksCollect(const RunRanksOptions& options, const RankBody& body);

// OK if every rank's body returned OK; otherwise an error whose message names
// every failed rank and why, e.g.
//   "2 of 3 ranks failed: rank 1: UNAVAILABLE: ...; rank 2: killed after 10s"
// The code is DEADLINE_EXCEEDED if any rank was killed at the timeout, else
// the first failed rank's code.
absl::Status RunRanks(int world_size, const RankBody& body, absl::Duration timeout);
absl::Status RunRanks(const RunRanksOptions& options, const RankBody& body);

// The message RunRanks builds from a set of outcomes (empty when all OK).
std::string DescribeFailures(const std::vector<RankOutcome>& outcomes);

}  // namespace vaedecode::parallel::testing
