#include "parallel/counting_communicator.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "parallel/comm_util.h"

namespace vaedecode::parallel {
namespace {

int64_t Bytes(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<int64_t>(tensor.numel()) * static_cast<int64_t>(tensor.element_size()) : 0;
}

int64_t OneRowBytes(const at::Tensor& local) {
  if (!local.defined() || local.dim() < 1) return 0;
  int64_t elements = 1;
  for (int64_t d = 1; d < local.dim(); ++d) elements *= local.size(d);
  return elements * static_cast<int64_t>(local.element_size());
}

// Rows of every rank except `rank` (bytes), for the gather accounting.
int64_t OtherRowsBytes(const at::Tensor& local, absl::Span<const int64_t> sizes, int rank) {
  int64_t rows = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (static_cast<int>(r) != rank) rows += sizes[r];
  }
  return rows * OneRowBytes(local);
}

// Milliseconds since construction.
class Stopwatch {
 public:
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

OpCounters SendRecvDelta(absl::Span<const P2POp> ops) {
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
  return delta;
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
  return calls == other.calls && local_calls == other.local_calls && sends == other.sends && recvs == other.recvs &&
         bytes_sent == other.bytes_sent && bytes_received == other.bytes_received && failures == other.failures;
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

CommStats& CommStats::operator+=(const CommStats& other) {
  for (size_t k = 0; k < by_kind.size(); ++k) {
    for (size_t op = 0; op < by_kind[k].size(); ++op) by_kind[k][op] += other.by_kind[k][op];
    blocked_ms[k] += other.blocked_ms[k];
  }
  return *this;
}

double CommStats::total_blocked_ms() const {
  double sum = 0;
  for (double ms : blocked_ms) sum += ms;
  return sum;
}

std::string CommStats::ToString() const {
  const OpCounters total = Total();
  std::string out =
      absl::StrCat("calls=", total.calls, " local_calls=", total.local_calls, " bytes=", HumanBytes(total.bytes()),
                   " (sent=", total.bytes_sent, " received=", total.bytes_received, ") failures=", total.failures);
  for (int k = 0; k < kNumCallKinds; ++k) {
    for (int o = 0; o < kNumOpTypes; ++o) {
      const OpCounters& c = by_kind[k][o];
      if (c == OpCounters{}) continue;
      absl::StrAppend(&out, "; ", AsAbsl(CallKindName(static_cast<CallKind>(k))), "/",
                      AsAbsl(OpTypeName(static_cast<OpType>(o))), ": ", c.DebugString());
    }
  }
  std::string blocked;
  for (int k = 0; k < kNumCallKinds; ++k) {
    if (blocked_ms[k] <= 0) continue;
    absl::StrAppend(&blocked, blocked.empty() ? "" : " ", AsAbsl(CallKindName(static_cast<CallKind>(k))), "=",
                    absl::StrFormat("%.1f", blocked_ms[k]));
  }
  if (!blocked.empty()) absl::StrAppend(&out, "; blocked_ms: ", blocked);
  return out;
}

CountingCommunicator::CountingCommunicator(Communicator& inner) : inner_(&inner) {}

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

void CountingCommunicator::Record(CallKind kind, OpType op, bool meets_peers, const OpCounters& delta, bool failed) {
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

void CountingCommunicator::AddBlocked(CallKind kind, double ms) {
  absl::MutexLock lock(&mu_);
  stats_.blocked_ms[static_cast<int>(kind)] += ms;
}

absl::Status CountingCommunicator::SendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  const OpCounters delta = SendRecvDelta(ops);
  const Stopwatch watch;
  absl::Status status = inner_->SendRecv(ops, kind);
  AddBlocked(kind, watch.ms());
  const bool meets = world_size() > 1 && !ops.empty();
  Record(kind, OpType::kSendRecv, meets, delta, !status.ok());
  return status;
}

// Counted as one SendRecv call when waited on (or abandoned).
class CountingCommunicator::CountedPending final : public PendingSendRecv {
 public:
  CountedPending(CountingCommunicator& owner, CallKind kind, bool meets, OpCounters delta,
                 std::unique_ptr<PendingSendRecv> inner)
      : owner_(owner), kind_(kind), meets_(meets), delta_(delta), inner_(std::move(inner)) {}
  ~CountedPending() override {
    if (!recorded_) owner_.Record(kind_, OpType::kSendRecv, meets_, delta_, /*failed=*/true);
  }
  absl::Status Wait() override {
    const Stopwatch watch;
    absl::Status status = inner_->Wait();
    owner_.AddBlocked(kind_, watch.ms());
    if (!recorded_) owner_.Record(kind_, OpType::kSendRecv, meets_, delta_, !status.ok());
    recorded_ = true;
    return status;
  }

 private:
  CountingCommunicator& owner_;
  const CallKind kind_;
  const bool meets_;
  const OpCounters delta_;
  std::unique_ptr<PendingSendRecv> inner_;
  bool recorded_ = false;
};

std::unique_ptr<PendingSendRecv> CountingCommunicator::StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  const Stopwatch watch;
  std::unique_ptr<PendingSendRecv> inner = inner_->StartSendRecv(ops, kind);
  AddBlocked(kind, watch.ms());
  return std::make_unique<CountedPending>(*this, kind, world_size() > 1 && !ops.empty(), SendRecvDelta(ops),
                                          std::move(inner));
}

absl::StatusOr<at::Tensor> CountingCommunicator::AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                           CallKind kind) {
  OpCounters delta;
  delta.bytes_sent = Bytes(local);
  delta.bytes_received = OtherRowsBytes(local, sizes, rank());
  const Stopwatch watch;
  absl::StatusOr<at::Tensor> result = inner_->AllGather(local, sizes, kind);
  AddBlocked(kind, watch.ms());
  Record(kind, OpType::kAllGather, world_size() > 1, delta, !result.ok());
  return result;
}

absl::Status CountingCommunicator::AllReduceSum(const at::Tensor& tensor, CallKind kind) {
  OpCounters delta;
  delta.bytes_sent = Bytes(tensor);
  delta.bytes_received = Bytes(tensor);
  const Stopwatch watch;
  absl::Status status = inner_->AllReduceSum(tensor, kind);
  AddBlocked(kind, watch.ms());
  Record(kind, OpType::kAllReduce, world_size() > 1, delta, !status.ok());
  return status;
}

absl::Status CountingCommunicator::Broadcast(const at::Tensor& tensor, int root, CallKind kind) {
  OpCounters delta;
  if (rank() == root) {
    delta.bytes_sent = Bytes(tensor);
  } else {
    delta.bytes_received = Bytes(tensor);
  }
  const Stopwatch watch;
  absl::Status status = inner_->Broadcast(tensor, root, kind);
  AddBlocked(kind, watch.ms());
  Record(kind, OpType::kBroadcast, world_size() > 1, delta, !status.ok());
  return status;
}

absl::StatusOr<at::Tensor> CountingCommunicator::GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                              int root, CallKind kind) {
  OpCounters delta;
  if (rank() == root) {
    delta.bytes_received = OtherRowsBytes(local, sizes, rank());
  } else {
    delta.bytes_sent = Bytes(local);
  }
  const Stopwatch watch;
  absl::StatusOr<at::Tensor> result = inner_->GatherToRoot(local, sizes, root, kind);
  AddBlocked(kind, watch.ms());
  Record(kind, OpType::kGather, world_size() > 1, delta, !result.ok());
  return result;
}

absl::Status CountingCommunicator::Barrier() {
  const Stopwatch watch;
  absl::Status status = inner_->Barrier();
  AddBlocked(CallKind::kOther, watch.ms());
  Record(CallKind::kOther, OpType::kBarrier, world_size() > 1, OpCounters{}, !status.ok());
  return status;
}

absl::Status CountingCommunicator::Synchronize() {
  const Stopwatch watch;
  absl::Status status = inner_->Synchronize();
  AddBlocked(CallKind::kOther, watch.ms());
  return status;
}

double CountingCommunicator::TakeCallMs() {
  const double on_device = inner_->TakeDeviceCallMs();
  return on_device >= 0 ? on_device : stats().total_blocked_ms();
}

}  // namespace vaedecode::parallel
