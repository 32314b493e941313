#include "worker/tiled_group_decode.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "device/device_memory.h"
#include "rpc/status_macros.h"
#include "tiling/calibration.h"
#include "tiling/tiled_decode.h"
#include "worker/group_job.h"

namespace vaedecode::worker {
namespace {

std::string DescribeTiles(const tiling::TilePlan& p) {
  return absl::StrCat(p.kind == tiling::PlanKind::kStock ? "stock tiles of " : "tiles of ", p.rows.tile, "x",
                      p.cols.tile, " latents");
}

enum Outcome { kOk = 0, kOutOfMemory = 1, kFailed = 2, kCancelled = 3 };

}  // namespace

absl::StatusOr<TiledGroupResult> DecodeTiledWithGroup(families::Decoder& decoder, parallel::Communicator& comm,
                                                      const at::Tensor& z,
                                                      const families::DecodeConditioning& conditioning,
                                                      const tiling::TilePlan& plan, const RowsReady& rows_ready,
                                                      const std::atomic<bool>* cancelled) {
  const int world = comm.world_size(), rank = comm.rank();
  const std::vector<tiling::TilePlan> ladder = tiling::OomLadder(plan, tiling::DecoderGeometry(decoder));
  // DenseOps on every rank, so a tile's bits do not depend on the rank that
  // decodes it; the leader checks for a cancellation between its tiles and
  // the peers learn of it in the round's agreement.
  families::DenseOps ops;
  for (size_t attempt = 0; attempt < ladder.size(); ++attempt) {
    const tiling::TilePlan& p = ladder[attempt];
    if (attempt > 0) {
      // The failed rung's blocks, cached at the sizes of its tiles, would
      // fragment the smaller tiles' allocations: give them back first.
      if (device::DeviceMemory* memory = device::ProcessDeviceMemory()) memory->ReleaseCachedBlocks();
    }
    const int64_t cols = static_cast<int64_t>(p.cols.starts.size());
    const int64_t tiles = static_cast<int64_t>(p.rows.starts.size()) * cols;
    std::vector<int64_t> tile_latent_shape = z.sizes().vec();
    tile_latent_shape[z.dim() - 2] = p.rows.tile;
    tile_latent_shape[z.dim() - 1] = p.cols.tile;
    const std::vector<int64_t> tile_shape = decoder.OutputShape(tile_latent_shape);
    int64_t tile_numel = 1;
    for (int64_t d : tile_shape) tile_numel *= d;
    tiling::TileBlender blender(p, decoder.info().spatial_factor);
    bool out_of_memory = false;
    for (int64_t round = 0; round * world < tiles && !out_of_memory; ++round) {
      const int64_t mine = round * world + rank;
      at::Tensor tile;
      absl::Status status;
      if (cancelled != nullptr && cancelled->load()) {
        status = absl::CancelledError("the request was cancelled");
      } else if (mine < tiles) {
        status = CatchExceptions("tiled decode", [&] {
          tile = decoder.Decode(tiling::TileLatent(z, p, mine / cols, mine % cols), ops, conditioning).to(at::kFloat);
        });
      }
      // Every rank learns every outcome of the round before anything else.
      const double code = status.ok()                                             ? kOk
                          : status.code() == absl::StatusCode::kResourceExhausted ? kOutOfMemory
                          : status.code() == absl::StatusCode::kCancelled         ? kCancelled
                                                                                  : kFailed;
      const at::TensorOptions on_comm = at::TensorOptions().device(comm.device());
      ASSIGN_OR_RETURN(at::Tensor codes, comm.AllGather(at::full({1, 1}, code, on_comm.dtype(at::kDouble)),
                                                        std::vector<int64_t>(world, 1), parallel::CallKind::kOther));
      const at::Tensor outcomes = codes.cpu();
      RETURN_IF_ERROR(comm.Synchronize());  // the outcomes came from a finished gather
      for (int r = 0; r < world; ++r) {
        if (outcomes[r][0].item<double>() == kCancelled)
          return InStep(absl::CancelledError("the request was cancelled"));
      }
      for (int r = 0; r < world; ++r) {
        const double c = outcomes[r][0].item<double>();
        if (c == kFailed) {
          return status.ok() ? absl::InternalError(absl::StrCat("rank ", r, " failed to decode its tile")) : status;
        }
        if (c == kOutOfMemory) out_of_memory = true;
      }
      if (out_of_memory) break;
      std::vector<int64_t> sizes(world, 0);
      for (int r = 0; r < world; ++r) sizes[r] = round * world + r < tiles ? 1 : 0;
      const at::Tensor local =
          mine < tiles ? tile.reshape({1, tile_numel}) : at::empty({0, tile_numel}, on_comm.dtype(at::kFloat));
      ASSIGN_OR_RETURN(at::Tensor gathered,
                       comm.GatherToRoot(local, sizes, kLeader, parallel::CallKind::kGatherOutput));
      if (rank != kLeader) continue;
      int64_t row = 0;
      for (int r = 0; r < world; ++r) {
        const int64_t k = round * world + r;
        if (k >= tiles) continue;
        blender.Add(k / cols, k % cols, (gathered)[row++].view(tile_shape));
      }
      if (rows_ready && attempt == 0) {
        // Tiles arrive in row-major order: every tile row before the first
        // incomplete one is blended, and only those cover the pixel rows
        // above that tile row's start.
        const int64_t done = std::min(tiles, (round + 1) * world);
        const int64_t f = decoder.info().spatial_factor;
        const int64_t final_rows = done == tiles ? p.rows.length * f : p.rows.starts[done / cols] * f;
        rows_ready(blender.blended(), final_rows);
      }
    }
    if (out_of_memory) continue;
    TiledGroupResult result;
    if (rank == kLeader) result.sample = blender.Finish(decoder.dtype());
    result.plan = p;
    result.retries = static_cast<int>(attempt);
    return result;
  }
  // Every rank saw every round's outcome: they all end here together.
  return InStep(absl::ResourceExhaustedError(
      absl::StrCat("tiled decode ran out of memory even with ", DescribeTiles(ladder.back()),
                   plan.reason.empty() ? "" : absl::StrCat(" (planned: ", plan.reason, ")"))));
}

}  // namespace vaedecode::worker
