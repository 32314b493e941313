#include "worker/exact_decode.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "families/sharded_ops.h"
#include "parallel/band_partition.h"
#include "parallel/sharded_ops.h"
#include "device/compute_device.h"
#include "device/device_memory.h"

namespace vaedecode::worker {
namespace {

// Fails the group with `status` so that peers blocked in a call return at once.
absl::Status AbortWith(parallel::Communicator& comm, absl::Status status) {
  comm.Abort(std::string(status.message()));
  return status;
}

}  // namespace

namespace {

absl::StatusOr<GroupDecodeResult> DecodeWithGroupUntimed(families::Decoder& decoder,
                                                         parallel::Communicator& comm,
                                                         const DecodeJob& job,
                                                         const GroupDecodeOptions& options) {
  GroupDecodeResult result;
  absl::Status valid = decoder.ValidateLatent(job.latent);
  if (!valid.ok()) return InStep(valid);  // every rank sees the same latent and the same verdict

  absl::Status shardable = options.allow_exact
                               ? decoder.CheckExactSharding(job.latent.sizes().vec(), comm.world_size())
                               : absl::FailedPreconditionError("dense decoding was requested");
  if (!shardable.ok()) {
    result.mode = "dense";
    result.reason = std::string(shardable.message());
    if (comm.world_size() > 1 && options.allow_exact) {
      spdlog::info("exact sharding not used: {}; the leader decodes densely", result.reason);
    }
    // The peers return at once; a failure of the leader's decode is its
    // alone (see GroupRuntime::Execute, which keeps the group in step).
    if (comm.rank() != kLeader) return result;
    families::CancellableDenseOps dense(options.cancelled);
    absl::StatusOr<at::Tensor> sample = RunDecode(decoder, job, dense);
    if (!sample.ok()) return comm.world_size() > 1 ? LeaderOnly(sample.status()) : sample.status();
    result.sample = *sample;
    return result;
  }

  result.mode = "exact";
  const int h_axis = static_cast<int>(job.latent.dim()) - 2;
  const parallel::ShardSpec latent_spec =
      parallel::ShardSpec::ForRows(h_axis, job.latent.size(h_axis), comm.rank(), comm.world_size());
  const parallel::Band band = latent_spec.local_band();
  DecodeJob local = job;
  // The band of the raw latent is the band of the VAE-space latent: the
  // de-normalisation is per channel.
  local.latent = job.latent.narrow(h_axis, band.begin, band.size()).contiguous();
  families::ShardedOps ops(comm, latent_spec);
  if (comm.rank() == kLeader) ops.set_cancel_flag(options.cancelled);
  absl::StatusOr<at::Tensor> rows = RunDecode(decoder, local, ops);
  // Every rank learns of a cancellation at the same norm: still in step.
  if (!rows.ok() && rows.status().code() == absl::StatusCode::kCancelled) return InStep(rows.status());
  if (!rows.ok()) return AbortWith(comm, rows.status());

  const auto gather_start = std::chrono::steady_clock::now();
  absl::StatusOr<at::Tensor> gathered = parallel::GatherRowsToRoot(
      comm, *rows, ops.SpecForRows(rows->size(h_axis), h_axis), kLeader);
  if (!gathered.ok()) return AbortWith(comm, gathered.status());
  result.gather_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - gather_start).count();
  result.sample = *gathered;
  return result;
}

}  // namespace

absl::StatusOr<GroupDecodeResult> DecodeWithGroup(families::Decoder& decoder,
                                                  parallel::Communicator& comm,
                                                  const DecodeJob& job,
                                                  const GroupDecodeOptions& options) {
  device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (memory != nullptr) memory->ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<GroupDecodeResult> result = DecodeWithGroupUntimed(decoder, comm, job, options);
  if (!result.ok()) return result;
  device::SynchronizeDevice(decoder.device());  // CUDA kernels run asynchronously
  result->decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (memory != nullptr) result->peak_bytes = memory->peak_bytes();
  return result;
}

absl::StatusOr<std::vector<RankStats>> GatherRankStats(parallel::Communicator& comm,
                                                       const GroupDecodeResult& mine) {
  const device::DeviceMemory* memory = device::ProcessDeviceMemory();
  const double free = memory == nullptr ? -1 : static_cast<double>(memory->free_bytes());
  const double capacity = memory == nullptr ? -1 : static_cast<double>(memory->capacity_bytes());
  at::Tensor local = at::tensor({mine.decode_ms, static_cast<double>(mine.peak_bytes), free, capacity}, at::kDouble)
                         .view({1, 4})
                         .to(comm.device());
  std::vector<int64_t> ones(comm.world_size(), 1);
  absl::StatusOr<at::Tensor> all = comm.world_size() == 1
                                       ? absl::StatusOr<at::Tensor>(local)
                                       : comm.GatherToRoot(local, ones, kLeader, parallel::CallKind::kOther);
  if (!all.ok()) return all.status();
  std::vector<RankStats> out;
  if (comm.rank() != kLeader) return out;
  *all = all->cpu();
  for (int64_t r = 0; r < all->size(0); ++r) {
    out.push_back({(*all)[r][0].item<double>(), static_cast<int64_t>((*all)[r][1].item<double>()),
                   static_cast<int64_t>((*all)[r][2].item<double>()),
                   static_cast<int64_t>((*all)[r][3].item<double>())});
  }
  return out;
}

}  // namespace vaedecode::worker
