#include "worker/group_encode.h"

#include <vector>

#include "families/sharded_layer_ops.h"
#include "parallel/communicator.h"
#include "parallel/sharded_ops.h"
#include "rpc/status_macros.h"
#include "worker/decode_job.h"

namespace vaedecode::worker {

using parallel::AbortWith;

EncodePlan PlanEncode(const families::Encoder& encoder, const at::Tensor& image, DecodeMode requested, int world_size) {
  EncodePlan plan;
  plan.image = image;
  if (world_size == 1) return plan;
  if (requested != DecodeMode::kExact) {
    plan.reason =
        requested == DecodeMode::kTiled ? "encodes are not tiled: decoded whole on the leader" : "dense was asked for";
    return plan;
  }
  const absl::Status shardable = encoder.CheckExactSharding(image.sizes().vec(), world_size);
  if (!shardable.ok()) {
    plan.reason = std::string(shardable.message());
    return plan;
  }
  plan.mode = DecodeMode::kExact;
  return plan;
}

absl::StatusOr<at::Tensor> ExecuteEncodePlan(families::Encoder& encoder, parallel::Communicator& comm,
                                             const EncodePlan& plan, const std::atomic<bool>* cancelled) {
  const bool leader = comm.rank() == kLeader;
  if (plan.mode != DecodeMode::kExact || comm.world_size() == 1) {
    if (!leader) return at::Tensor();
    if (cancelled == nullptr) {
      families::DenseOps dense;
      return EncodePrepared(encoder, plan.image, dense);
    }
    families::CancellableDenseOps dense(cancelled);  // long convolutions and attention checked between bands
    return EncodePrepared(encoder, plan.image, dense);
  }
  const at::Tensor& image = plan.image;
  const int h_axis = static_cast<int>(image.dim()) - 2;
  const std::vector<parallel::ShardSpec> levels =
      families::RowLevelSpecs(encoder.RowLevels(image.size(h_axis)), comm.rank(), comm.world_size());
  const parallel::Band band = levels.front().local_band();
  families::ShardedLayerOps ops(comm, levels);
  if (leader) ops.set_cancel_flag(cancelled);
  absl::StatusOr<at::Tensor> rows =
      EncodePrepared(encoder, image.narrow(h_axis, band.begin, band.size()).contiguous(), ops);
  // Every rank learns of a cancellation at the same GroupNorm: still in step.
  if (!rows.ok() && rows.status().code() == absl::StatusCode::kCancelled) return InStep(rows.status());
  if (!rows.ok()) return AbortWith(comm, rows.status());
  parallel::ShardSpec latent = levels.back();
  latent.axis = h_axis;
  absl::StatusOr<at::Tensor> moments = parallel::GatherRowsToRoot(comm, *rows, latent, kLeader);
  if (!moments.ok()) return AbortWith(comm, moments.status());
  return *moments;
}

absl::StatusOr<GroupEncodeResult> EncodeWithGroup(families::Encoder& encoder, parallel::Communicator& comm,
                                                  const EncodeJob& job, const GroupEncodeOptions& options) {
  absl::StatusOr<at::Tensor> image = PrepareImage(encoder, job);
  if (!image.ok()) return InStep(image.status());  // every rank sees the same image and the same verdict
  const EncodePlan plan =
      PlanEncode(encoder, *image, options.allow_exact ? DecodeMode::kExact : DecodeMode::kDense, comm.world_size());
  ASSIGN_OR_RETURN(at::Tensor moments, ExecuteEncodePlan(encoder, comm, plan));
  GroupEncodeResult out{{}, plan.mode, plan.reason};
  if (comm.rank() != kLeader) return out;
  ASSIGN_OR_RETURN(out.output, FinishEncode(encoder, moments, job));
  return out;
}

}  // namespace vaedecode::worker
