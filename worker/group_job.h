#pragma once

// What the leader of a group tells its peers before each collective step:
// a fixed-size header (kind, model, mode, latent shape/dtype/space) and, for
// decodes, the latent itself. Peers learn everything from the header; no
// shape is ever negotiated.
//
// Every rank calls BroadcastJob in the same order; the leader passes its job,
// peers pass nullptr. Idle leaders send heartbeats so that peers waiting for
// work never hit the communicator's timeout.

#include <cstdint>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "worker/decode_job.h"

namespace vaedecode::worker {

inline constexpr int kLeader = 0;

enum class JobKind : int64_t { kDecode = 0, kHeartbeat = 1, kShutdown = 2 };

struct GroupJob {
  JobKind kind = JobKind::kDecode;
  int64_t model_index = 0;  // into the group's model list (same order on every rank)
  bool allow_exact = true;  // false: the leader decodes densely (a forced dense request)
  DecodeJob decode;         // only for kDecode
  // Tiled decodes: every rank decodes whole tiles of this size (latents);
  // 0 = not tiled. `stock_tiles` selects diffusers' stock layout.
  int64_t tile_rows = 0;
  int64_t tile_cols = 0;
  bool stock_tiles = false;
};

absl::StatusOr<GroupJob> BroadcastJob(parallel::Communicator& comm, const GroupJob* job);

}  // namespace vaedecode::worker
