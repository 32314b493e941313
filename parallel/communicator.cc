#include "parallel/communicator.h"

#include <string>

namespace vaedecode::parallel {

std::string_view CallKindName(CallKind kind) {
  switch (kind) {
    case CallKind::kHalo:
      return "halo";
    case CallKind::kGroupNormStats:
      return "group_norm_stats";
    case CallKind::kAttentionKV:
      return "attention_kv";
    case CallKind::kGatherOutput:
      return "gather_output";
    case CallKind::kBroadcastJob:
      return "broadcast_job";
    case CallKind::kOther:
      return "other";
  }
  return "unknown";
}

absl::Status AbortWith(Communicator& comm, absl::Status status) {
  comm.Abort(std::string(status.message()));
  return status;
}

}  // namespace vaedecode::parallel
