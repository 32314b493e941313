#include "worker/exact_decode.h"

#include <chrono>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "families/sharded_layer_ops.h"
#include "families/status_error.h"
#include "parallel/band_partition.h"
#include "parallel/sharded_ops.h"
#include "worker/group_job.h"

namespace vaedecode::worker {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Gathers each chunk of frames the decoder finishes to the leader as it
// finishes, so the leader can stream it while the next chunk decodes; the
// leader keeps the gathered chunks (the whole output, once every frame came).
class FrameGatheringOps final : public families::ForwardingOps {
 public:
  FrameGatheringOps(families::ShardedLayerOps& sharded, parallel::Communicator& comm, const FramesReady& frames_ready)
      : ForwardingOps(sharded), sharded_(sharded), comm_(comm), frames_ready_(frames_ready) {}

  void FramesFinished(const at::Tensor& frames) override {
    const int h_axis = static_cast<int>(frames.dim()) - 2;
    const auto start = Clock::now();
    absl::StatusOr<at::Tensor> gathered = parallel::GatherRowsToRoot(
        comm_, frames.contiguous(), sharded_.SpecForRows(frames.size(h_axis), h_axis), kLeader);
    if (!gathered.ok()) throw families::StatusError(gathered.status());
    gather_ms_ += MsSince(start);
    if (comm_.rank() == kLeader) {
      if (frames_ready_) frames_ready_(*gathered, frames_done_);
      chunks_.push_back(*gathered);
    }
    frames_done_ += frames.size(2);
  }

  int64_t frames_done() const { return frames_done_; }
  double gather_ms() const { return gather_ms_; }
  // The leader's whole output (every chunk gathered); undefined on peers.
  at::Tensor sample() const {
    if (chunks_.empty()) return at::Tensor();
    return chunks_.size() == 1 ? chunks_[0] : at::cat(chunks_, 2);
  }

 private:
  families::ShardedLayerOps& sharded_;
  parallel::Communicator& comm_;
  const FramesReady& frames_ready_;
  std::vector<at::Tensor> chunks_;
  int64_t frames_done_ = 0;
  double gather_ms_ = 0;
};

}  // namespace

using parallel::AbortWith;
absl::StatusOr<ExactRows> DecodeExactBands(families::Decoder& decoder, parallel::Communicator& comm,
                                           const DecodePlan& plan, const std::atomic<bool>* cancelled,
                                           const OutputProgress& progress, families::DecodeStream* stream) {
  const at::Tensor& z = plan.latent;
  const int h_axis = static_cast<int>(z.dim()) - 2;
  const parallel::ShardSpec latent_spec =
      parallel::ShardSpec::ForRows(h_axis, z.size(h_axis), comm.rank(), comm.world_size());
  const parallel::Band band = latent_spec.local_band();
  families::ShardedLayerOps sharded(comm, latent_spec);
  if (comm.rank() == kLeader) sharded.set_cancel_flag(cancelled);
  sharded.set_cancel_with_halo(decoder.info().cancel_with_halo);
  sharded.set_overlap_halo(plan.overlap_halo);
  FrameGatheringOps ops(sharded, comm, progress.frames_ready);
  absl::StatusOr<at::Tensor> rows = DecodePrepared(decoder, z.narrow(h_axis, band.begin, band.size()).contiguous(),
                                                   plan.conditioning, ops, stream, plan.session.ends);
  // Every rank learns of a cancellation at the same op: still in step.
  if (!rows.ok() && rows.status().code() == absl::StatusCode::kCancelled) return InStep(rows.status());
  if (!rows.ok()) return AbortWith(comm, rows.status());

  ExactRows out;
  const int out_h_axis = static_cast<int>(rows->dim()) - 2;
  if (rows->dim() == 5 && rows->size(2) == 0) {
    // A session's chunk that finished no frame (a window stream waiting for
    // latents): the whole height, no frames.
    std::vector<int64_t> shape = decoder.OutputShape(z.sizes().vec());
    shape[2] = 0;
    out.sample = at::empty(shape, rows->options());
    return out;
  }
  if (rows->dim() == 5 && ops.frames_done() == rows->size(2)) {
    // Every frame was gathered as it finished.
    out.sample = ops.sample();
    out.gather_ms = ops.gather_ms();
    return out;
  }
  if (ops.frames_done() != 0) {
    // Every rank decoded the same frames: a partial stream is a decoder bug.
    return AbortWith(comm, absl::InternalError("the decoder finished some of its frames but not all"));
  }
  // The leader's band is the output's top rows: it may go out while the
  // others' arrive.
  if (comm.rank() == kLeader && progress.rows_ready) progress.rows_ready(*rows, rows->size(out_h_axis));
  const auto gather_start = Clock::now();
  absl::StatusOr<at::Tensor> gathered =
      parallel::GatherRowsToRoot(comm, *rows, sharded.SpecForRows(rows->size(out_h_axis), out_h_axis), kLeader);
  if (!gathered.ok()) return AbortWith(comm, gathered.status());
  out.gather_ms = MsSince(gather_start);
  out.sample = *gathered;
  return out;
}

}  // namespace vaedecode::worker
