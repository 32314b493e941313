#pragma once

// What the leader of a group tells its peers before each collective step:
// a fixed-size header (kind, model, the plan's mode and tiles, the latent's
// or image's shape and dtype, the timestep) and, for decodes and encodes,
// the prepared latent or image itself. Peers learn the whole plan from it; no shape is ever negotiated.
//
// Every rank calls BroadcastJob in the same order; the leader passes its job,
// peers pass nullptr. Idle leaders send heartbeats so that peers waiting for
// work never hit the communicator's timeout.

#include <cstdint>

#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "worker/decode_plan.h"  // kLeader
#include "worker/group_encode.h"

namespace vaedecode::worker {

// kSessionClose: every rank drops a streaming session's state (the plan's
// session id; no payload).
enum class JobKind : int64_t { kDecode = 0, kHeartbeat = 1, kShutdown = 2, kEncode = 3, kSessionClose = 4 };

struct GroupJob {
  JobKind kind = JobKind::kDecode;
  int64_t model_index = 0;  // into the group's model list (same order on every rank)
  // Only for kDecode (and kSessionClose's session id). Peers receive its
  // mode, latent, conditioning, tile shape, world size and session id and
  // start; the reason, noise seed, the leader's tile estimate and a replay's
  // frame count stay on the leader.
  DecodePlan plan;
  // Only for kEncode: peers receive its mode and image.
  EncodePlan encode;
};

absl::StatusOr<GroupJob> BroadcastJob(parallel::Communicator& comm, const GroupJob* job);

}  // namespace vaedecode::worker
