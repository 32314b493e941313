#include "worker/exact_decode.h"

#include <chrono>
#include <vector>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "families/sharded_ops.h"
#include "parallel/band_partition.h"
#include "parallel/sharded_ops.h"
#include "worker/counting_cpu_allocator.h"

namespace vaedecode::worker {
namespace {

constexpr int64_t kMaxDims = 6;
// Header: [dims, sizes x kMaxDims, dtype, latent space].
constexpr int64_t kHeaderLength = 1 + kMaxDims + 2;

absl::StatusOr<at::ScalarType> DtypeFromCode(int64_t code) {
  switch (code) {
    case 0:
      return at::kFloat;
    case 1:
      return at::kBFloat16;
    case 2:
      return at::kHalf;
    case 3:
      return at::kDouble;
  }
  return absl::InvalidArgumentError(absl::StrCat("bad dtype code ", code, " in a job header"));
}

absl::StatusOr<int64_t> CodeFromDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return 0;
    case at::kBFloat16:
      return 1;
    case at::kHalf:
      return 2;
    case at::kDouble:
      return 3;
    default:
      return absl::InvalidArgumentError(absl::StrCat("latent dtype ", c10::toString(t), " cannot be decoded"));
  }
}

// Fails the group with `status` so that peers blocked in a call return at once.
absl::Status AbortWith(parallel::Communicator& comm, absl::Status status) {
  comm.Abort(std::string(status.message()));
  return status;
}

}  // namespace

absl::StatusOr<DecodeJob> BroadcastJob(parallel::Communicator& comm, const DecodeJob* job) {
  at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
  if (comm.rank() == kLeader) {
    if (job == nullptr || !job->latent.defined() || job->latent.dim() > kMaxDims) {
      return AbortWith(comm, absl::InvalidArgumentError("leader has no valid job to broadcast"));
    }
    absl::StatusOr<int64_t> code = CodeFromDtype(job->latent.scalar_type());
    if (!code.ok()) return AbortWith(comm, code.status());
    auto* h = header.data_ptr<int64_t>();
    h[0] = job->latent.dim();
    for (int64_t d = 0; d < job->latent.dim(); ++d) h[1 + d] = job->latent.size(d);
    h[1 + kMaxDims] = *code;
    h[2 + kMaxDims] = job->latent_space == families::LatentSpace::kRaw ? 1 : 0;
  }
  if (comm.world_size() == 1) return *job;
  if (absl::Status s = comm.Broadcast(header, kLeader, parallel::CallKind::kBroadcastJob); !s.ok()) return s;

  const auto* h = header.data_ptr<int64_t>();
  if (h[0] < 1 || h[0] > kMaxDims) return AbortWith(comm, absl::InvalidArgumentError("bad job header"));
  std::vector<int64_t> shape(h + 1, h + 1 + h[0]);
  absl::StatusOr<at::ScalarType> dtype = DtypeFromCode(h[1 + kMaxDims]);
  if (!dtype.ok()) return AbortWith(comm, dtype.status());

  DecodeJob out;
  out.latent_space = h[2 + kMaxDims] == 1 ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
  out.latent = comm.rank() == kLeader ? job->latent.contiguous() : at::empty(shape, at::TensorOptions().dtype(*dtype));
  if (absl::Status s = comm.Broadcast(out.latent, kLeader, parallel::CallKind::kBroadcastJob); !s.ok()) return s;
  return out;
}

namespace {

absl::StatusOr<GroupDecodeResult> DecodeWithGroupUntimed(families::Decoder& decoder,
                                                         parallel::Communicator& comm,
                                                         const DecodeJob& job) {
  GroupDecodeResult result;
  absl::Status valid = decoder.ValidateLatent(job.latent);
  if (!valid.ok()) return valid;  // every rank sees the same latent and the same verdict

  absl::Status shardable = decoder.CheckExactSharding(job.latent.sizes().vec(), comm.world_size());
  if (!shardable.ok()) {
    result.mode = "dense";
    result.reason = std::string(shardable.message());
    if (comm.world_size() > 1) spdlog::info("exact sharding not used: {}; leader decodes densely", result.reason);
    if (comm.rank() != kLeader) return result;
    families::DenseOps dense;
    absl::StatusOr<at::Tensor> sample = RunDecode(decoder, job, dense);
    if (!sample.ok()) return sample.status();
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
  absl::StatusOr<at::Tensor> rows = RunDecode(decoder, local, ops);
  if (!rows.ok()) return AbortWith(comm, rows.status());

  absl::StatusOr<at::Tensor> gathered = parallel::GatherRowsToRoot(
      comm, *rows, ops.SpecForRows(rows->size(h_axis), h_axis), kLeader);
  if (!gathered.ok()) return AbortWith(comm, gathered.status());
  result.sample = *gathered;
  return result;
}

}  // namespace

absl::StatusOr<GroupDecodeResult> DecodeWithGroup(families::Decoder& decoder,
                                                  parallel::Communicator& comm,
                                                  const DecodeJob& job) {
  CountingCpuAllocator* allocator = CountingCpuAllocator::Installed();
  if (allocator != nullptr) allocator->ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<GroupDecodeResult> result = DecodeWithGroupUntimed(decoder, comm, job);
  if (!result.ok()) return result;
  result->decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (allocator != nullptr) result->peak_bytes = allocator->peak_bytes();
  return result;
}

absl::StatusOr<std::vector<RankStats>> GatherRankStats(parallel::Communicator& comm,
                                                       const GroupDecodeResult& mine) {
  at::Tensor local = at::tensor({mine.decode_ms, static_cast<double>(mine.peak_bytes)}, at::kDouble).view({1, 2});
  std::vector<int64_t> ones(comm.world_size(), 1);
  absl::StatusOr<at::Tensor> all = comm.world_size() == 1
                                       ? absl::StatusOr<at::Tensor>(local)
                                       : comm.GatherToRoot(local, ones, kLeader, parallel::CallKind::kOther);
  if (!all.ok()) return all.status();
  std::vector<RankStats> out;
  if (comm.rank() != kLeader) return out;
  for (int64_t r = 0; r < all->size(0); ++r) {
    out.push_back({(*all)[r][0].item<double>(), static_cast<int64_t>((*all)[r][1].item<double>())});
  }
  return out;
}

}  // namespace vaedecode::worker
