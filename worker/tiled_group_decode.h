#pragma once

// Tiled decode spread over a group: every rank decodes whole tiles with the
// dense decoder (tile k on rank k mod N), and after each round the leader
// gathers the round's tiles and blends them as they arrive. Each round first
// agrees on every rank's outcome (one small all-gather), so an out-of-memory
// on any rank moves every rank to the next plan of the ladder (floor tiles,
// then stock tiles) together and the group stays in step.
//
// Every rank calls it with the same job and plan (from the job header).
//
// Streaming: `rows_ready` lets the leader send row bands while later tiles
// are still decoding. If an out-of-memory retry comes after some rows were
// sent, the rest of the image comes from the retry's plan (both are
// seam-free decodes; their junction is at a finished-row boundary).

#include <functional>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "tiling/planner.h"
#include "worker/decode_job.h"

namespace vaedecode::worker {

struct TiledGroupResult {
  at::Tensor sample;     // the whole output on the leader; undefined on peers
  tiling::TilePlan plan;  // the plan that succeeded
  int retries = 0;        // out-of-memory retries taken
};

// Leader: called after each round with the blended output so far and the
// number of leading pixel rows that are final (no later tile touches them).
using RowsReady = std::function<void(const at::Tensor& blended, int64_t final_rows)>;

absl::StatusOr<TiledGroupResult> DecodeTiledWithGroup(families::Decoder& decoder, parallel::Communicator& comm,
                                                      const DecodeJob& job, const tiling::TilePlan& plan,
                                                      const RowsReady& rows_ready = nullptr);

// The plan every rank rebuilds from a job header's tile size (or stock flag).
tiling::TilePlan PlanFromHeader(const families::Decoder& decoder, int64_t rows, int64_t cols, int64_t tile_rows,
                                int64_t tile_cols, bool stock);

// "RxC tiles of AxB latents over N rank(s)", for headers, trailers and logs.
std::string DescribePlan(const tiling::TilePlan& plan, int world_size);

}  // namespace vaedecode::worker
