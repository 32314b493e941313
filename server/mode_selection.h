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
};

struct ModeChoice {
  // The mode forwarded to the group leader: MODE_DENSE or MODE_EXACT (never
  // MODE_AUTO). The leader may still fall back to dense for a latent too
  // small to shard; its header says what it used.
  v1::Mode mode = v1::MODE_DENSE;
  std::string reason;
};

// Rules (for now): a forced mode is honoured or refused, never switched —
// MODE_TILED is UNIMPLEMENTED, MODE_EXACT on a group of one rank or on a
// model whose adapter cannot shard is INVALID_ARGUMENT. MODE_AUTO picks exact
// when the group has more than one rank and the model supports it, else
// dense.
absl::StatusOr<ModeChoice> SelectMode(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                                      const GroupResources& group);

// "DENSE", "EXACT", …: the label value used in metrics and logs.
std::string ModeName(v1::Mode mode);

}  // namespace vaedecode::server
