#pragma once

// An encode on a group: dense on the leader while the peers return at once,
// or exact row bands, every rank encoding its band of the image through
// ShardedLayerOps (halo exchange, strided convolutions reading the band
// below, merged GroupNorm statistics, gathered K/V) at the encoder's row
// levels (families::RowLevelSpecs), the moments' rows gathered to the
// leader, which finishes the posterior. Every rank calls it with the same
// job (the CLI's group and tests hold it everywhere).
//
// Errors are Statuses: an image the model refuses is refused on every rank
// alike (InStep); a failure mid-encode aborts the communicator so the peers
// fail fast.

#include <string>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "parallel/communicator.h"
#include "worker/decode_plan.h"
#include "worker/encode_job.h"

namespace vaedecode::worker {

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
