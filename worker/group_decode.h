#pragma once

// The executor: runs one DecodePlan (decode_plan.h) on a group, whatever its
// mode — dense on the leader while the peers return at once, exact row
// bands (exact_decode.h), or whole tiles spread over the ranks
// (tiled_group_decode.h) — and times it. The service's GroupRuntime and the
// CLI's group of one or more ranks call it; every rank of the group calls it
// with the same plan (the leader's, or the one its job header rebuilt).
//
// Errors are Statuses; an error that leaves the ranks in step is marked
// InStep, one the leader alone saw LeaderOnly (decode_job.h).

#include <atomic>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "worker/decode_job.h"
#include "worker/decode_plan.h"
#include "worker/group_job.h"  // kLeader
#include "worker/output_progress.h"
#include "worker/tiled_group_decode.h"

namespace vaedecode::worker {

struct GroupDecodeResult {
  at::Tensor sample;  // the whole output on the leader; undefined on peers
  DecodeMode mode = DecodeMode::kDense;
  std::string reason;      // the plan's (leader), e.g. why dense when exact was asked for
  double decode_ms = 0;    // this rank: its decode plus the row gather
  double gather_ms = 0;    // of which gathering rows to the leader
  int tile_retries = 0;    // tiled: out-of-memory retries taken
  tiling::TilePlan tiles;  // tiled: the plan that succeeded
  std::string tile_plan;   // tiled: DescribePlan of it
  int64_t peak_bytes = 0;  // this rank's allocator peak during the decode (0 if not counted)
  double comm_ms = 0;      // of decode_ms, blocked in communicator calls (set by the runtime)
  // Bytes this rank holds for streaming sessions after the job: the job's
  // own session, and every session (set by the runtime).
  int64_t session_state_bytes = 0;
  int64_t sessions_bytes = 0;
};

// One rank's figures for a decode, as the leader reports them.
struct RankStats {
  double decode_ms = 0;
  int64_t peak_bytes = 0;
  double comm_ms = 0;               // of decode_ms, blocked in communicator calls
  int64_t free_bytes = -1;          // under this rank's memory budget; -1 when unbounded
  int64_t capacity_bytes = -1;      // DeviceMemory::capacity_bytes; -1 when unbounded
  int64_t session_state_bytes = 0;  // the job's session's state on this rank
  int64_t sessions_bytes = 0;       // every streaming session's state on this rank
};

struct ExecuteOptions {
  // Leader only: set to true to stop the decode on every rank (CANCELLED,
  // the group still in step).
  const std::atomic<bool>* cancelled = nullptr;
  // Leader: sees the output as parts of it become final (tiled rows; the
  // leader's own exact band; exact and dense frames of frame-by-frame
  // decoders).
  OutputProgress progress;
  // A session chunk's: this rank's state of the session (dense: the
  // leader's; exact: every rank's band of it). Not for tiled plans.
  families::DecodeStream* stream = nullptr;
};

absl::StatusOr<GroupDecodeResult> ExecutePlan(families::Decoder& decoder, parallel::Communicator& comm,
                                              const DecodePlan& plan, const ExecuteOptions& options = {});

// For callers whose every rank holds the same job (tests, benchmarks):
// every rank plans it (exact when it can be sharded and allow_exact, else
// dense) and executes the plan. A latent the model refuses is refused on
// every rank alike (InStep).
struct GroupDecodeOptions {
  bool allow_exact = true;
  const std::atomic<bool>* cancelled = nullptr;  // leader only
};
absl::StatusOr<GroupDecodeResult> DecodeWithGroup(families::Decoder& decoder, parallel::Communicator& comm,
                                                  const DecodeJob& job, const GroupDecodeOptions& options = {});

// Every rank's figures on the leader (empty on peers): one small gather,
// made after the decode so it never counts as one of its collectives.
absl::StatusOr<std::vector<RankStats>> GatherRankStats(parallel::Communicator& comm, const GroupDecodeResult& mine);

}  // namespace vaedecode::worker
