#pragma once

// One decode by a group of ranks (after the job was broadcast, see
// group_job.h): every rank decodes its row band exactly (or the leader alone
// decodes densely when the latent cannot be sharded), and the rows are
// gathered to the leader.
//
// Every rank of the group calls these functions in the same order. Errors are
// Statuses; on any error this rank aborts the communicator so its peers fail
// fast instead of waiting for the timeout.

#include <atomic>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "worker/decode_job.h"
#include "worker/group_job.h"

namespace vaedecode::worker {

struct GroupDecodeResult {
  at::Tensor sample;    // the whole output on the leader; undefined on peers
  std::string mode;     // "exact" or "dense"
  std::string reason;   // why dense, when it fell back
  double decode_ms = 0;         // this rank: its decode plus the row gather
  double gather_ms = 0;         // of which gathering rows to the leader
  int tile_retries = 0;         // tiled: out-of-memory retries taken
  std::string tile_plan;        // tiled: the plan that succeeded
  int64_t peak_bytes = 0;       // this rank's allocator peak during the decode (0 if not counted)
};

// One rank's figures for a decode, as the leader reports them.
struct RankStats {
  double decode_ms = 0;
  int64_t peak_bytes = 0;
  int64_t free_bytes = -1;      // under this rank's memory budget; -1 when unbounded
  int64_t capacity_bytes = -1;  // DeviceMemory::capacity_bytes; -1 when unbounded
};

// Decodes `job` (identical on every rank) with the group. World size 1,
// latents the family cannot shard and !allow_exact decode densely on the
// leader while the peers return at once. A cancelled decode returns
// CANCELLED on every rank and leaves the group in step.
struct GroupDecodeOptions {
  bool allow_exact = true;
  // Leader only: set to true to stop the decode on every rank (CANCELLED).
  const std::atomic<bool>* cancelled = nullptr;
};

absl::StatusOr<GroupDecodeResult> DecodeWithGroup(families::Decoder& decoder,
                                                  parallel::Communicator& comm,
                                                  const DecodeJob& job,
                                                  const GroupDecodeOptions& options = {});

// Every rank's figures on the leader (empty on peers): one small gather,
// made after the decode so it never counts as one of its collectives.
absl::StatusOr<std::vector<RankStats>> GatherRankStats(parallel::Communicator& comm,
                                                       const GroupDecodeResult& mine);

}  // namespace vaedecode::worker
