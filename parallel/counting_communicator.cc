#include "parallel/counting_communicator.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/comm_util.h"

namespace vaedecode::parallel {
namespace {

int64_t Bytes(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<int64_t>(tensor.numel()) *
                                static_cast<int64_t>(tensor.element_size())
                          : 0;
}

int64_t OneRowBytes(const at::Tensor& local) {
  if (!local.defined() || local.dim() < 1) return 0;
  int64_t elements = 1;
  for (int64_t d = 1; d < local.dim(); ++d) elements *= local.size(d);
  return elements * static_cast<int64_t>(local.element_size());
}

// Rows of every rank except `rank` (bytes), for the gather accounting.
int64_t OtherRowsBytes(const at::Tensor& local, absl::Span<const int64_t> sizes,
                       int rank) {
  int64_t rows = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (static_cast<int>(r) != rank) rows += sizes[r];
  }
  return rows * OneRowBytes(local);
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, "B");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f%s", value, units[unit]);
}

}  // namespace

std::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kSendRecv:
      return "send_recv";
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kGather:
      return "gather";
    case OpType::kBarrier:
      return "barrier";
  }
  return "unknown";
}

OpCounters& OpCounters::operator+=(const OpCounters& other) {
  calls += other.calls;
  local_calls += other.local_calls;
  sends += other.sends;
  recvs += other.recvs;
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  failures += other.failures;
  return *this;
}

bool OpCounters::operator==(const OpCounters& other) const {
  return calls == other.calls && local_calls == other.local_calls &&
         sends == other.sends && recvs == other.recvs &&
         bytes_sent == other.bytes_sent &&
         bytes_received == other.bytes_received && failures == other.failures;
}

std::string OpCounters::DebugString() const {
  std::string out = absl::StrCat("calls=", calls);
  if (local_calls != 0) absl::StrAppend(&out, " local_calls=", local_calls);
  if (sends != 0 || recvs != 0) {
    absl::StrAppend(&out, " sends=", sends, " recvs=", recvs);
  }
  absl::StrAppend(&out, " sent=", bytes_sent, " received=", bytes_received);
  if (failures != 0) absl::StrAppend(&out, " failures=", failures);
  return out;
}

OpCounters CommStats::ForKind(CallKind kind) const {
  OpCounters sum;
  for (const OpCounters& c : by_kind[static_cast<int>(kind)]) sum += c;
  return sum;
}

OpCounters CommStats::ForOp(OpType op) const {
  OpCounters sum;
  for (const auto& row : by_kind) sum += row[static_cast<int>(op)];
  return sum;
}

OpCounters CommStats::Total() const {
  OpCounters sum;
  for (const auto& row : by_kind) {
    for (const OpCounters& c : row) sum += c;
  }
  return sum;
}

std::string CommStats::ToString() const {
  const OpCounters total = Total();
  std::string out = absl::StrCat(
      "calls=", total.calls, " local_calls=", total.local_calls,
      " bytes=", HumanBytes(total.bytes()), " (sent=", total.bytes_sent,
      " received=", total.bytes_received, ") failures=", total.failures);
  for (int k = 0; k < kNumCallKinds; ++k) {
    for (int o = 0; o < kNumOpTypes; ++o) {
      const OpCounters& c = by_kind[k][o];
      if (c == OpCounters{}) continue;
      absl::StrAppend(
          &out, "; ", AsAbsl(CallKindName(static_cast<CallKind>(k))), "/",
          AsAbsl(OpTypeName(static_cast<OpType>(o))), ": ", c.DebugString());
    }
  }
  return out;
}

CountingCommunicator::CountingCommunicator(Communicator& inner)
    : inner_(&inner) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : owned_(std::move(inner)), inner_(owned_.get()) {}

CommStats CountingCommunicator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CountingCommunicator::Reset() {
  absl::MutexLock lock(&mu_);
  stats_ = CommStats{};
}

void CountingCommunicator::Record(CallKind kind, OpType op, bool meets_peers,
                                  const OpCounters& delta, bool failed) {
  absl::MutexLock lock(&mu_);
  OpCounters& c = stats_.at(kind, op);
  if (meets_peers) {
    ++c.calls;
    c += delta;
  } else {
    ++c.local_calls;
    // A local call moves nothing; only SendRecv message counts (empty batch:
    // zero) would apply.
  }
  if (failed) ++c.failures;
}

absl::Status CountingCommunicator::SendRecv(absl::Span<const P2POp> ops,
                                            CallKind kind) {
  OpCounters delta;
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::kSend) {
      ++delta.sends;
      delta.bytes_sent += Bytes(op.tensor);
    } else {
      ++delta.recvs;
      delta.bytes_received += Bytes(op.tensor);
    }
  }
  absl::Status status = inner_->SendRecv(ops, kind);
  const bool meets = world_size() > 1 && !ops.empty();
  Record(kind, OpType::kSendRecv, meets, delta, !status.ok());
  return status;
}

absl::StatusOr<at::Tensor> CountingCommunicator::AllGather(
    const at::Tensor& local, absl::Span<const int64_t> sizes, CallKind kind) {
  OpCounters delta;
  delta.bytes_sent = Bytes(local);
  delta.bytes_received = OtherRowsBytes(local, sizes, rank());
  absl::StatusOr<at::Tensor> result = inner_->AllGather(local, sizes, kind);
  Record(kind, OpType::kAllGather, world_size() > 1, delta, !result.ok());
  return result;
}

absl::Status CountingCommunicator::AllReduceSum(const at::Tensor& tensor,
                                                CallKind kind) {
  OpCounters delta;
  delta.bytes_sent = Bytes(tensor);
  delta.bytes_received = Bytes(tensor);
  absl::Status status = inner_->AllReduceSum(tensor, kind);
  Record(kind, OpType::kAllReduce, world_size() > 1, delta, !status.ok());
  return status;
}

absl::Status CountingCommunicator::Broadcast(const at::Tensor& tensor, int root,
                                             CallKind kind) {
  OpCounters delta;
  if (rank() == root) {
    delta.bytes_sent = Bytes(tensor);
  } else {
    delta.bytes_received = Bytes(tensor);
  }
  absl::Status status = inner_->Broadcast(tensor, root, kind);
  Record(kind, OpType::kBroadcast, world_size() > 1, delta, !status.ok());
  return status;
}

absl::StatusOr<at::Tensor> CountingCommunicator::GatherToRoot(
    const at::Tensor& local, absl::Span<const int64_t> sizes, int root,
    CallKind kind) {
  OpCounters delta;
  if (rank() == root) {
    delta.bytes_received = OtherRowsBytes(local, sizes, rank());
  } else {
    delta.bytes_sent = Bytes(local);
  }
  absl::StatusOr<at::Tensor> result =
      inner_->GatherToRoot(local, sizes, root, kind);
  Record(kind, OpType::kGather, world_size() > 1, delta, !result.ok());
  return result;
}

absl::Status CountingCommunicator::Barrier() {
  absl::Status status = inner_->Barrier();
  Record(CallKind::kOther, OpType::kBarrier, world_size() > 1, OpCounters{},
         !status.ok());
  return status;
}

}  // namespace vaedecode::parallel
