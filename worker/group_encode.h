#pragma once

// An encode on a group, planned on the leader and executed by every rank:
// dense on the leader while the peers return at once, or exact row bands,
// every rank encoding its band of the image through ShardedLayerOps (halo
// exchange, strided convolutions reading the band below, merged GroupNorm
// statistics, gathered K/V) at the encoder's row levels
// (families::RowLevelSpecs), the moments' rows gathered to the leader, which
// finishes the posterior (FinishEncode). The plan travels to the peers in
// the job broadcast (group_job.h), the image with it.
//
// Errors are Statuses; a failure mid-encode aborts the communicator so the
// peers fail fast.

#include <atomic>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "parallel/communicator.h"
#include "worker/decode_plan.h"
#include "worker/encode_job.h"

namespace vaedecode::worker {

struct EncodePlan {
  DecodeMode mode = DecodeMode::kDense;  // dense or exact
  std::string reason;                    // leader: why dense when exact was asked for
  at::Tensor image;                      // PrepareImage's: the encoder's dtype, on its device
};

// Leader: exact when `requested` is and the image shards over `world_size`
// ranks (Encoder::CheckExactSharding), dense otherwise (tiled encodes do
// not exist: asked for, they are dense with the reason).
EncodePlan PlanEncode(const families::Encoder& encoder, const at::Tensor& image, DecodeMode requested, int world_size);

// Every rank with the same plan: the whole image's moments on the leader,
// an undefined tensor on peers (a dense plan's return at once). Setting
// *cancelled (the leader's; nullptr on peers) stops the encode on every rank
// with CANCELLED, the group still in step (InStep).
absl::StatusOr<at::Tensor> ExecuteEncodePlan(families::Encoder& encoder, parallel::Communicator& comm,
                                             const EncodePlan& plan, const std::atomic<bool>* cancelled = nullptr);

// For callers whose every rank holds the same job (tests): every rank
// prepares and plans it (exact when it shards and allow_exact), executes the
// plan, and the leader finishes the posterior. An image the model refuses
// is refused on every rank alike (InStep).
struct GroupEncodeOptions {
  bool allow_exact = true;
};

struct GroupEncodeResult {
  EncodeResult output;  // the leader's; empty on peers
  DecodeMode mode = DecodeMode::kDense;
  std::string reason;  // why dense at world size > 1
};

absl::StatusOr<GroupEncodeResult> EncodeWithGroup(families::Encoder& encoder, parallel::Communicator& comm,
                                                  const EncodeJob& job, const GroupEncodeOptions& options = {});

}  // namespace vaedecode::worker
