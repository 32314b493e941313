#include "worker/group_encode.h"

#include <vector>

#include "families/sharded_layer_ops.h"
#include "parallel/communicator.h"
#include "parallel/sharded_ops.h"
#include "rpc/status_macros.h"
#include "worker/decode_job.h"
#include "worker/group_job.h"

namespace vaedecode::worker {

using parallel::AbortWith;

absl::StatusOr<GroupEncodeResult> EncodeWithGroup(families::Encoder& encoder, parallel::Communicator& comm,
                                                  const EncodeJob& job, const GroupEncodeOptions& options) {
  absl::StatusOr<at::Tensor> image = PrepareImage(encoder, job);
  if (!image.ok()) return InStep(image.status());  // every rank sees the same image and the same verdict
  GroupEncodeResult out;
  const bool leader = comm.rank() == kLeader;
  absl::Status shardable = encoder.CheckExactSharding(image->sizes().vec(), comm.world_size());
  if (!options.allow_exact) shardable = absl::FailedPreconditionError("exact encoding was not allowed");
  if (comm.world_size() == 1 || !shardable.ok()) {
    if (comm.world_size() > 1) out.reason = std::string(shardable.message());
    if (!leader) return out;
    families::DenseOps dense;
    ASSIGN_OR_RETURN(at::Tensor moments, EncodePrepared(encoder, *image, dense));
    ASSIGN_OR_RETURN(out.output, FinishEncode(encoder, moments, job));
    return out;
  }
  out.mode = DecodeMode::kExact;
  const int h_axis = static_cast<int>(image->dim()) - 2;
  const std::vector<parallel::ShardSpec> levels =
      families::RowLevelSpecs(encoder.RowLevels(image->size(h_axis)), comm.rank(), comm.world_size());
  const parallel::Band band = levels.front().local_band();
  families::ShardedLayerOps ops(comm, levels);
  absl::StatusOr<at::Tensor> rows =
      EncodePrepared(encoder, image->narrow(h_axis, band.begin, band.size()).contiguous(), ops);
  if (!rows.ok()) return AbortWith(comm, rows.status());
  parallel::ShardSpec latent = levels.back();
  latent.axis = h_axis;
  absl::StatusOr<at::Tensor> moments = parallel::GatherRowsToRoot(comm, *rows, latent, kLeader);
  if (!moments.ok()) return AbortWith(comm, moments.status());
  if (!leader) return out;
  ASSIGN_OR_RETURN(out.output, FinishEncode(encoder, *moments, job));
  return out;
}

}  // namespace vaedecode::worker
