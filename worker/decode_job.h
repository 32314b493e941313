#pragma once

// Runs one decode on a loaded decoder: the single place where LibTorch's
// c10::Error (and any other exception) is turned into an absl::Status, so
// nothing throws past a worker, the CLI or a process boundary.

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/layer_ops.h"

namespace vaedecode::worker {

struct DecodeJob {
  at::Tensor latent;  // NCHW or NCTHW, any float dtype; any device (moved to the decoder's)
  families::LatentSpace latent_space = families::LatentSpace::kVae;
  families::DecodeConditioning conditioning;  // the decode timestep (LTX)
};

// Validates the latent, converts it to VAE space when it is `raw`, decodes it
// through `ops`. INVALID_ARGUMENT for a latent the model cannot take,
// RESOURCE_EXHAUSTED when memory runs out, INTERNAL for other failures.
absl::StatusOr<at::Tensor> RunDecode(families::Decoder& decoder, const DecodeJob& job,
                                     families::LayerOps& ops);

// Calls `fn`, mapping any exception to a Status with `what` as context.
absl::Status CatchExceptions(const char* what, const std::function<void()>& fn);

// Marks an error every rank of the group returns together, at the same step
// (so the group can serve the next job), and tells it apart from one rank's
// failure. A status payload: it survives copies, not a trip over gRPC.
absl::Status InStep(absl::Status status);
bool IsInStep(const absl::Status& status);

// Marks an error only the leader saw while the peers went on (a dense decode
// runs on the leader alone): the leader must still meet the peers at the
// job's closing collective.
absl::Status LeaderOnly(absl::Status status);
bool IsLeaderOnly(const absl::Status& status);

}  // namespace vaedecode::worker
