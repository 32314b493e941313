#pragma once

// Tiled decode spread over a group: every rank decodes whole tiles with the
// dense decoder (tile k on rank k mod N), and after each round the leader
// gathers the round's tiles and blends them as they arrive. Each round first
// agrees on every rank's outcome (one small all-gather), so an out-of-memory
// on any rank moves every rank to the next plan of the ladder (floor tiles,
// then stock tiles) together and the group stays in step.
//
// Every rank calls it with the same prepared latent and plan (from the job
// header). A cancellation on the leader is learnt by every rank at the
// round's agreement: all return CANCELLED together.
//
// Streaming: `rows_ready` (called after each round with the blended output
// so far: its rows no later tile touches are final) lets the leader send
// row bands while later tiles are still decoding. If an out-of-memory retry comes after some rows were
// sent, the rest of the image comes from the retry's plan (both are
// seam-free decodes; their junction is at a finished-row boundary).

#include <atomic>
#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "tiling/planner.h"
#include "worker/decode_job.h"
#include "worker/output_progress.h"

namespace vaedecode::worker {

struct TiledGroupResult {
  at::Tensor sample;      // the whole output on the leader; undefined on peers
  tiling::TilePlan plan;  // the plan that succeeded
  int retries = 0;        // out-of-memory retries taken
};

// `z`: the prepared latent (PrepareLatent). `cancelled`: the leader's flag.
absl::StatusOr<TiledGroupResult> DecodeTiledWithGroup(families::Decoder& decoder, parallel::Communicator& comm,
                                                      const at::Tensor& z,
                                                      const families::DecodeConditioning& conditioning,
                                                      const tiling::TilePlan& plan,
                                                      const RowsReady& rows_ready = nullptr,
                                                      const std::atomic<bool>* cancelled = nullptr);

}  // namespace vaedecode::worker
