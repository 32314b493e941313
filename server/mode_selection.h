#pragma once

// The one function that decides how a request is decoded on a group. The
// scheduler calls it twice: before queueing (with the group size every group
// has and no memory figures) to refuse an impossible forced mode at once, and
// again when a group takes the job, with that group's free memory. The tiling
// issue plugs its budget check in here.
//
// Thread-safe: pure function.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// What a group offers a request.
struct GroupResources {
  int degree = 1;                            // ranks in the group
  std::vector<int64_t> free_bytes_per_rank;  // empty when not measured
  // The most each rank could ever have free for a decode (its budget or
  // device less its models); empty or -1 entries when unbounded.
  std::vector<int64_t> capacity_bytes_per_rank;
};

struct ModeChoice {
  // The mode forwarded to the group leader: MODE_DENSE, MODE_EXACT or
  // MODE_TILED (never MODE_AUTO). The leader may still fall back to dense
  // for a latent too small to shard; its header says what it used.
  v1::Mode mode = v1::MODE_DENSE;
  std::string reason;
  // Nothing fits the group's free memory now: keep the job queued on this
  // group and ask again (until the request's deadline).
  bool wait_for_memory = false;
};

// Estimated decode peaks, from the model's measured profile through the one
// memory model (tiling/memory_model.h), with its headroom.
struct PeakEstimates {
  int64_t dense = 0;       // the whole latent on one rank
  int64_t exact_rank = 0;  // the largest per-rank share in exact mode (rows + halos), plus the
                           // leader's gathered output
  int64_t floor_tile = 0;  // one floor tile (tiling::kFloorTile a side), plus the leader's output
};
PeakEstimates EstimatePeaks(const v1::DecodeRequest& request, const v1::ModelInfo& model, int degree);

// Rules: a forced mode is honoured or refused, never switched. MODE_EXACT on
// a group of one rank or on a model that cannot shard is INVALID_ARGUMENT;
// a forced mode whose estimate exceeds the free memory measured on the group
// is FAILED_PRECONDITION with the numbers. MODE_AUTO (DESIGN.md): exact if
// every rank has room for its share with headroom; else tiled if a floor
// tile fits the leader; else RESOURCE_EXHAUSTED with the numbers when even
// a floor tile exceeds the tightest rank's capacity (waiting cannot help);
// else wait for memory. Without memory figures (empty
// free_bytes_per_rank, or -1 entries for ranks without a budget) memory is
// taken as sufficient: exact when the group has more than one rank and the
// model supports it, else dense.
absl::StatusOr<ModeChoice> SelectMode(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                                      const GroupResources& group);

}  // namespace vaedecode::server
