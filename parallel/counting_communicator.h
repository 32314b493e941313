#pragma once

// A Communicator decorator that counts what passes through it, per call-site
// kind and per operation, for tests that assert the collective budget of an
// operator and for the "collectives per decode" metric.
//
// Definitions (all counts are this rank's; deterministic for a given call
// sequence, independent of the backend and of its transport algorithm):
//  * calls: interface calls that meet at least one other rank, one per call
//    (a SendRecv batch is one call however many messages it holds). This is
//    the number of synchronisation points the design budgets.
//  * local_calls: calls that met nobody: any call at world size 1, and a
//    SendRecv with an empty batch. Operators should not make these at all.
//  * sends / recvs: point-to-point messages of SendRecv batches (op count,
//    zero-element messages included).
//  * bytes_sent / bytes_received: logical payload, i.e. the bytes this rank
//    contributes and the bytes it obtains from other ranks, excluding
//    transport padding, forwarding by ring/tree algorithms and headers:
//      send_recv   sent: sum of send tensors, received: sum of recv tensors
//      all_gather  sent: local's bytes, received: the other ranks' rows
//      all_reduce  sent and received: the tensor's bytes each
//      broadcast   root sent: the tensor's bytes once; others received it
//      gather      non-root sent: local's bytes; root received the other
//                  ranks' rows
//      barrier     0
//    Rows of another rank r are sizes[r] * (bytes of one row of local).
//    Nothing is counted as bytes at world size 1.
//  * failures: calls that returned an error (also counted in calls or
//    local_calls, with the bytes they attempted).
// Barrier is recorded under CallKind::kOther.
//
// Besides the counts, the time this rank spent blocked inside calls, per
// kind (a StartSendRecv batch: its start and its Wait, not the compute in
// between). Measured, so not deterministic: outside OpCounters and their
// equality.
//
// Thread-safe: stats() and Reset() may run concurrently with calls.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "parallel/communicator.h"

namespace vaedecode::parallel {

enum class OpType {
  kSendRecv,
  kAllGather,
  kAllReduce,
  kBroadcast,
  kGather,
  kBarrier,
};
inline constexpr int kNumOpTypes = 6;

// "send_recv", "all_gather", "all_reduce", "broadcast", "gather", "barrier".
std::string_view OpTypeName(OpType op);

struct OpCounters {
  int64_t calls = 0;
  int64_t local_calls = 0;
  int64_t sends = 0;
  int64_t recvs = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t failures = 0;

  int64_t bytes() const { return bytes_sent + bytes_received; }
  OpCounters& operator+=(const OpCounters& other);
  bool operator==(const OpCounters& other) const;
  bool operator!=(const OpCounters& other) const { return !(*this == other); }
  std::string DebugString() const;
};

struct CommStats {
  // by_kind[CallKind][OpType]
  std::array<std::array<OpCounters, kNumOpTypes>, kNumCallKinds> by_kind{};

  const OpCounters& at(CallKind kind, OpType op) const { return by_kind[static_cast<int>(kind)][static_cast<int>(op)]; }
  OpCounters& at(CallKind kind, OpType op) { return by_kind[static_cast<int>(kind)][static_cast<int>(op)]; }
  OpCounters ForKind(CallKind kind) const;  // summed over operations
  OpCounters ForOp(OpType op) const;        // summed over kinds
  OpCounters Total() const;
  // Total().calls: the synchronisation points so far.
  int64_t collectives() const { return Total().calls; }

  // Milliseconds blocked in calls, by CallKind.
  std::array<double, kNumCallKinds> blocked_ms{};
  double total_blocked_ms() const;
  // Adds another run's counts and times (a session's chunks, summed).
  CommStats& operator+=(const CommStats& other);

  // One line: totals, then every non-zero (kind, op) cell, e.g.
  // "calls=3 local_calls=0 bytes=1.5KiB (sent=512 received=1024) failures=0;
  //  halo/send_recv: calls=2 sends=4 recvs=4 sent=256 received=256; ...;
  //  blocked_ms: halo=0.4 ..."
  std::string ToString() const;
};

class CountingCommunicator final : public Communicator {
 public:
  // Borrows `inner`, which must outlive this object.
  explicit CountingCommunicator(Communicator& inner);
  // Owns `inner`.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner);

  CommStats stats() const;
  void Reset();
  std::string ToString() const { return stats().ToString(); }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  c10::Device device() const override { return inner_->device(); }

  absl::Status SendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  std::unique_ptr<PendingSendRecv> StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  absl::StatusOr<at::Tensor> AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                       CallKind kind) override;
  absl::Status AllReduceSum(const at::Tensor& tensor, CallKind kind) override;
  absl::Status Broadcast(const at::Tensor& tensor, int root, CallKind kind) override;
  absl::StatusOr<at::Tensor> GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes, int root,
                                          CallKind kind) override;
  absl::Status Barrier() override;
  void Abort(std::string_view reason) override { inner_->Abort(reason); }
  // Forwarded; the time blocked in Synchronize counts as kOther.
  absl::Status Synchronize() override;
  double TakeDeviceCallMs() override { return inner_->TakeDeviceCallMs(); }
  // The time this rank's calls took: measured on the device where the
  // backend times its calls there (TakeDeviceCallMs, taken), else the time
  // blocked in calls so far.
  double TakeCallMs();

 private:
  class CountedPending;
  void Record(CallKind kind, OpType op, bool meets_peers, const OpCounters& delta, bool failed);
  void AddBlocked(CallKind kind, double ms);

  std::unique_ptr<Communicator> owned_;
  Communicator* const inner_;

  mutable absl::Mutex mu_;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vaedecode::parallel
