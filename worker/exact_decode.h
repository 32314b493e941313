#pragma once

// The exact mode of the executor (group_decode.h): every rank decodes its
// row band of the prepared latent through ShardedLayerOps (halo exchange, merged
// GroupNorm statistics, all-gathered K/V), and the rows are gathered to the
// leader. Every rank of the group calls it with the same plan. On an error
// other than a cancellation (which every rank learns at the same norm) this
// rank aborts the communicator so its peers fail fast.
//
// Streaming (leader, `progress`): a decoder that finishes frames in order
// (LayerOps::FramesFinished) has each chunk's rows gathered as it finishes
// (one gather per chunk instead of one at the end) and the leader sees the
// whole frames; otherwise the leader sees its own band (the output's top
// rows) before it gathers the others'.

#include <atomic>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "worker/decode_plan.h"
#include "worker/output_progress.h"

namespace vaedecode::worker {

struct ExactRows {
  at::Tensor sample;     // the whole output on the leader; undefined on peers
  double gather_ms = 0;  // gathering the rows to the leader
};

// `cancelled`, `progress`: the leader's (nullptr / empty on peers).
absl::StatusOr<ExactRows> DecodeExactBands(families::Decoder& decoder, parallel::Communicator& comm,
                                           const DecodePlan& plan, const std::atomic<bool>* cancelled,
                                           const OutputProgress& progress = {},
                                           families::DecodeStream* stream = nullptr);

}  // namespace vaedecode::worker
