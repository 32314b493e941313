#include "worker/group_decode.h"

#include <chrono>

#include <ATen/ATen.h>

#include "absl/strings/str_format.h"
#include "device/compute_device.h"
#include "device/device_memory.h"
#include "rpc/status_macros.h"
#include "worker/exact_decode.h"
#include "worker/group_job.h"

namespace vaedecode::worker {
namespace {

// Hands a dense decode's finished frames to the caller as they finish.
class FramesToCallerOps final : public families::ForwardingOps {
 public:
  FramesToCallerOps(families::LayerOps& inner, const FramesReady& frames_ready)
      : ForwardingOps(inner), frames_ready_(frames_ready) {}
  void FramesFinished(const at::Tensor& frames) override {
    if (frames_ready_) frames_ready_(frames, frames_done_);
    frames_done_ += frames.size(2);
  }

 private:
  const FramesReady& frames_ready_;
  int64_t frames_done_ = 0;
};

absl::StatusOr<GroupDecodeResult> ExecuteUntimed(families::Decoder& decoder, parallel::Communicator& comm,
                                                 const DecodePlan& plan, const ExecuteOptions& options) {
  GroupDecodeResult result;
  result.mode = plan.mode;
  result.reason = plan.reason;
  switch (plan.mode) {
    case DecodeMode::kDense: {
      // The peers return at once; a failure of the leader's decode is its
      // alone (see GroupRuntime::Execute, which keeps the group in step).
      if (comm.rank() != kLeader) return result;
      families::CancellableDenseOps dense(options.cancelled);
      FramesToCallerOps ops(dense, options.progress.frames_ready);
      absl::StatusOr<at::Tensor> sample =
          DecodePrepared(decoder, plan.latent, plan.conditioning, ops, options.stream, plan.session.ends);
      if (!sample.ok()) return comm.world_size() > 1 ? LeaderOnly(sample.status()) : sample.status();
      result.sample = *sample;
      return result;
    }
    case DecodeMode::kExact: {
      ASSIGN_OR_RETURN(ExactRows rows,
                       DecodeExactBands(decoder, comm, plan, options.cancelled, options.progress, options.stream));
      result.sample = rows.sample;
      result.gather_ms = rows.gather_ms;
      return result;
    }
    case DecodeMode::kTiled: {
      if (options.stream != nullptr) return absl::InternalError("a session's chunk cannot be decoded in tiles");
      // Every rank rebuilds the tiles from the header's shape: the same plan everywhere.
      tiling::TilePlan tiles = PlanFromHeader(decoder, plan.latent.size(-2), plan.latent.size(-1), plan.tile_shape);
      // What an exhausted ladder's error says the plan was made against.
      tiles.reason = plan.budget_bytes < 0
                         ? plan.reason
                         : absl::StrFormat("%s; the budget is %.1f MiB and a %d-latent floor tile needs about %.1f MiB",
                                           plan.reason, plan.budget_bytes / 1048576.0, tiling::kFloorTile,
                                           plan.floor_tile_bytes / 1048576.0);
      ASSIGN_OR_RETURN(TiledGroupResult tiled,
                       DecodeTiledWithGroup(decoder, comm, plan.latent, plan.conditioning, tiles,
                                            options.progress.rows_ready, options.cancelled));
      result.sample = tiled.sample;
      result.tile_retries = tiled.retries;
      result.tiles = tiled.plan;
      result.tile_plan = DescribePlan(tiled.plan, comm.world_size());
      return result;
    }
  }
  return absl::InternalError("unknown decode mode");
}

}  // namespace

absl::StatusOr<GroupDecodeResult> ExecutePlan(families::Decoder& decoder, parallel::Communicator& comm,
                                              const DecodePlan& plan, const ExecuteOptions& options) {
  device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (memory != nullptr) memory->ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  (void)comm.TakeDeviceCallMs();  // the decode's calls only, not the job's broadcast
  absl::StatusOr<GroupDecodeResult> result = ExecuteUntimed(decoder, comm, plan, options);
  // On a GPU the collectives are queued, not finished: one that failed
  // (aborted, timed out) may have left garbage that the decode went on with,
  // or a cancellation read from it. Its failure is the job's.
  RETURN_IF_ERROR(comm.Synchronize());
  if (!result.ok()) return result;
  device::SynchronizeDevice(decoder.device());  // CUDA kernels run asynchronously
  result->decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (memory != nullptr) result->peak_bytes = memory->peak_bytes();
  return result;
}

absl::StatusOr<GroupDecodeResult> DecodeWithGroup(families::Decoder& decoder, parallel::Communicator& comm,
                                                  const DecodeJob& job, const GroupDecodeOptions& options) {
  PlanningContext context;
  context.requested = options.allow_exact ? DecodeMode::kExact : DecodeMode::kDense;
  context.world_size = comm.world_size();
  absl::StatusOr<DecodePlan> plan = PlanDecode(decoder, job, context);
  if (!plan.ok()) return InStep(plan.status());  // every rank sees the same latent and the same verdict
  return ExecutePlan(decoder, comm, *plan, {options.cancelled, {}});
}

absl::StatusOr<std::vector<RankStats>> GatherRankStats(parallel::Communicator& comm, const GroupDecodeResult& mine) {
  const device::DeviceMemory* memory = device::ProcessDeviceMemory();
  const double free = memory == nullptr ? -1 : static_cast<double>(memory->free_bytes());
  const double capacity = memory == nullptr ? -1 : static_cast<double>(memory->capacity_bytes());
  at::Tensor local =
      at::tensor({mine.decode_ms, static_cast<double>(mine.peak_bytes), free, capacity, mine.comm_ms,
                  static_cast<double>(mine.session_state_bytes), static_cast<double>(mine.sessions_bytes)},
                 at::kDouble)
          .view({1, 7})
          .to(comm.device());
  std::vector<int64_t> ones(comm.world_size(), 1);
  ASSIGN_OR_RETURN(at::Tensor all, comm.world_size() == 1
                                       ? absl::StatusOr<at::Tensor>(local)
                                       : comm.GatherToRoot(local, ones, kLeader, parallel::CallKind::kOther));
  std::vector<RankStats> out;
  if (comm.rank() != kLeader) return out;
  all = all.cpu();
  RETURN_IF_ERROR(comm.Synchronize());  // what was read came from a gather that finished
  for (int64_t r = 0; r < all.size(0); ++r) {
    RankStats stats;
    stats.decode_ms = (all)[r][0].item<double>();
    stats.peak_bytes = static_cast<int64_t>((all)[r][1].item<double>());
    stats.free_bytes = static_cast<int64_t>((all)[r][2].item<double>());
    stats.capacity_bytes = static_cast<int64_t>((all)[r][3].item<double>());
    stats.comm_ms = (all)[r][4].item<double>();
    stats.session_state_bytes = static_cast<int64_t>((all)[r][5].item<double>());
    stats.sessions_bytes = static_cast<int64_t>((all)[r][6].item<double>());
    out.push_back(stats);
  }
  return out;
}

}  // namespace vaedecode::worker
