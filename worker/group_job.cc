#include "worker/group_job.h"

#include <cstring>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

using parallel::AbortWith;
namespace {

constexpr int64_t kMaxDims = 6;
// Header: [kind, model, mode, dims, tile_rows, tile_cols, stock_tiles,
//          overlap_halo, sizes x kMaxDims, dtype, has timestep, timestep's bits,
//          session id, session flags (1: start, 2: ends)].
constexpr int64_t kFixed = 8;
constexpr int64_t kTimestep = kFixed + kMaxDims + 1;
constexpr int64_t kSession = kTimestep + 2;
constexpr int64_t kHeaderLength = kSession + 2;
constexpr int64_t kLastKind = static_cast<int64_t>(JobKind::kSessionClose);

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
      return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(t), " cannot travel in a job"));
  }
}

// Decodes carry their latent; exact encodes their image (a dense encode
// runs on the leader alone: its peers need nothing).
bool HasPayload(JobKind kind, DecodeMode mode) {
  return kind == JobKind::kDecode || (kind == JobKind::kEncode && mode == DecodeMode::kExact);
}

// The tensor a job carries: a decode's latent, an encode's image.
at::Tensor& Payload(GroupJob& job) { return job.kind == JobKind::kEncode ? job.encode.image : job.plan.latent; }
const at::Tensor& Payload(const GroupJob& job) {
  return job.kind == JobKind::kEncode ? job.encode.image : job.plan.latent;
}

}  // namespace

absl::StatusOr<GroupJob> BroadcastJob(parallel::Communicator& comm, const GroupJob* job) {
  // Filled and read on the host; travels on the communicator's device.
  at::Tensor header = at::zeros({kHeaderLength}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  if (comm.rank() == kLeader) {
    if (job == nullptr) return AbortWith(comm, absl::InternalError("the leader has no job to broadcast"));
    const DecodePlan& plan = job->plan;
    h[0] = static_cast<int64_t>(job->kind);
    h[1] = job->model_index;
    h[2] = static_cast<int64_t>(plan.mode);
    h[4] = plan.tile_shape.rows;
    h[5] = plan.tile_shape.cols;
    h[6] = plan.tile_shape.stock ? 1 : 0;
    h[7] = plan.overlap_halo ? 1 : 0;
    h[kSession] = plan.session.id;
    h[kSession + 1] = (plan.session.start ? 1 : 0) | (plan.session.ends ? 2 : 0);
    if (job->kind == JobKind::kEncode) h[2] = static_cast<int64_t>(job->encode.mode);
    if (HasPayload(job->kind, job->kind == JobKind::kEncode ? job->encode.mode : plan.mode)) {
      const at::Tensor& payload = Payload(*job);
      if (!payload.defined() || payload.dim() < 1 || payload.dim() > kMaxDims) {
        return absl::InvalidArgumentError("latent or image must have 1 to 6 dimensions");
      }
      ASSIGN_OR_RETURN(int64_t code, CodeFromDtype(payload.scalar_type()));
      h[3] = payload.dim();
      for (int64_t d = 0; d < payload.dim(); ++d) h[kFixed + d] = payload.size(d);
      h[kFixed + kMaxDims] = code;
      if (const std::optional<double>& t = plan.conditioning.timestep; job->kind == JobKind::kDecode && t) {
        h[kTimestep] = 1;
        std::memcpy(&h[kTimestep + 1], &*t, sizeof(double));  // the exact double, not a rounded int
      }
    }
    if (comm.world_size() == 1) return *job;
  }
  at::Tensor sent = header.to(comm.device());
  RETURN_IF_ERROR(comm.Broadcast(sent, kLeader, parallel::CallKind::kBroadcastJob));
  header = sent.cpu();
  // On a GPU the broadcast was queued: trust the header only if it finished.
  RETURN_IF_ERROR(comm.Synchronize());
  h = header.data_ptr<int64_t>();

  GroupJob out;
  if (h[0] < 0 || h[0] > kLastKind) return AbortWith(comm, absl::InternalError("bad job kind in a job header"));
  out.kind = static_cast<JobKind>(h[0]);
  out.model_index = h[1];
  if (h[2] < 0 || h[2] > 2) return AbortWith(comm, absl::InternalError("bad mode in a job header"));
  out.plan.mode = static_cast<DecodeMode>(h[2]);
  out.plan.tile_shape = {h[4], h[5], h[6] == 1};
  out.plan.overlap_halo = h[7] == 1;
  out.plan.world_size = comm.world_size();
  out.plan.session.id = h[kSession];
  out.plan.session.start = (h[kSession + 1] & 1) != 0;
  out.plan.session.ends = (h[kSession + 1] & 2) != 0;
  if (out.kind == JobKind::kEncode) out.encode.mode = out.plan.mode;
  if (!HasPayload(out.kind, out.plan.mode)) {
    if (comm.rank() == kLeader && out.kind == JobKind::kEncode) out.encode = job->encode;  // the leader's own image
    return out;
  }
  if (h[3] < 1 || h[3] > kMaxDims) return AbortWith(comm, absl::InternalError("bad rank in a job header"));
  std::vector<int64_t> shape(h + kFixed, h + kFixed + h[3]);
  absl::StatusOr<at::ScalarType> dtype = DtypeFromCode(h[kFixed + kMaxDims]);
  if (!dtype.ok()) return AbortWith(comm, dtype.status());
  if (h[kTimestep] == 1) {
    double t = 0;
    std::memcpy(&t, &h[kTimestep + 1], sizeof(double));
    out.plan.conditioning.timestep = t;
  }
  if (comm.rank() == kLeader) {
    // The leader keeps its whole plan; the latent or image travels as it is
    // (it is prepared on the leader's device, the communicator's).
    out.plan = job->plan;
    out.encode = job->encode;
    Payload(out) = Payload(*job).to(comm.device()).contiguous();
  } else {
    Payload(out) = at::empty(shape, at::TensorOptions().dtype(*dtype).device(comm.device()));
  }
  RETURN_IF_ERROR(comm.Broadcast(Payload(out), kLeader, parallel::CallKind::kBroadcastJob));
  return out;
}

}  // namespace vaedecode::worker
