#include "worker/exact_decode.h"

#include <chrono>
#include <string>

#include <ATen/ATen.h>

#include "families/sharded_ops.h"
#include "parallel/band_partition.h"
#include "parallel/sharded_ops.h"
#include "worker/group_job.h"

namespace vaedecode::worker {

using parallel::AbortWith;
absl::StatusOr<ExactRows> DecodeExactBands(families::Decoder& decoder, parallel::Communicator& comm,
                                           const DecodePlan& plan, const std::atomic<bool>* cancelled) {
  const at::Tensor& z = plan.latent;
  const int h_axis = static_cast<int>(z.dim()) - 2;
  const parallel::ShardSpec latent_spec =
      parallel::ShardSpec::ForRows(h_axis, z.size(h_axis), comm.rank(), comm.world_size());
  const parallel::Band band = latent_spec.local_band();
  families::ShardedOps ops(comm, latent_spec);
  if (comm.rank() == kLeader) ops.set_cancel_flag(cancelled);
  absl::StatusOr<at::Tensor> rows =
      DecodePrepared(decoder, z.narrow(h_axis, band.begin, band.size()).contiguous(), plan.conditioning, ops);
  // Every rank learns of a cancellation at the same norm: still in step.
  if (!rows.ok() && rows.status().code() == absl::StatusCode::kCancelled) return InStep(rows.status());
  if (!rows.ok()) return AbortWith(comm, rows.status());

  const auto gather_start = std::chrono::steady_clock::now();
  absl::StatusOr<at::Tensor> gathered = parallel::GatherRowsToRoot(
      comm, *rows, ops.SpecForRows(rows->size(h_axis), h_axis), kLeader);
  if (!gathered.ok()) return AbortWith(comm, gathered.status());
  ExactRows out;
  out.gather_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - gather_start).count();
  out.sample = *gathered;
  return out;
}

}  // namespace vaedecode::worker
