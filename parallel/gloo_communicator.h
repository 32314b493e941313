#pragma once

// Communicator over c10d's ProcessGroupGloo (CPU tensors; tests and CPU
// serving), a c10d Backend in LibTorch 2.x.
//
// Transport: point-to-point messages carry SendRecv, AllGather,
// GatherToRoot and Broadcast (receives land directly in the result's rows,
// so an uneven gather needs no padding and no copy); Gloo collectives carry
// AllReduceSum and Barrier. Messages between a pair of ranks are tagged with
// per-pair sequence numbers, so ranks that are not part of an exchange need
// not take part in it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "parallel/abort_watcher.h"
#include "parallel/comm_util.h"
#include "parallel/communicator.h"
#include "parallel/store.h"

namespace c10d {
class ProcessGroupGloo;
class Work;
}  // namespace c10d

namespace vaedecode::parallel {

// How AllGather moves rows: every rank sends its rows to every other rank
// (W-1 messages each way, posted together; uneven sizes cost nothing), or
// Gloo's own all-gather (uneven sizes padded to the largest). bench/comm
// measured point-to-point faster for every payload and group size it tried
// (docs/BENCHMARKS.md); native is there to measure against.
enum class GlooAllGather { kPointToPoint, kNative };

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Names the group's keys in the store; several groups may share a store.
  // Unique per incarnation (see store.h).
  std::string group_name = "default";
  // Bounds Create and every call.
  absl::Duration timeout = absl::Seconds(60);

  // Rendezvous. If `store` is set it is used (shared by several groups, e.g.
  // from ConnectTcpStore); otherwise a TCPStore at store_host:store_port is
  // hosted by rank 0 and joined by the others. Not used at world size 1.
  c10::intrusive_ptr<c10d::Store> store;
  std::string store_host = "127.0.0.1";
  int store_port = 0;

  // Address this rank's Gloo transport binds to and advertises to its peers.
  std::string bind_host = "127.0.0.1";
  // How often a rank blocked in a call looks for an abort published by
  // another rank.
  absl::Duration abort_poll_interval = absl::Milliseconds(100);
  // Gloo writes with writev, which raises SIGPIPE when a peer has reset the
  // connection; the default action would kill this rank instead of failing
  // the call. If set and SIGPIPE still has its default action, Create sets
  // it to ignored, process-wide (writes then fail with EPIPE).
  bool ignore_sigpipe = true;
  GlooAllGather all_gather = GlooAllGather::kPointToPoint;
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group: returns once every rank has joined and the Gloo mesh is
  // connected, or an error within about `timeout` (DEADLINE_EXCEEDED naming
  // the ranks that never joined, UNAVAILABLE for transport/store failures,
  // INVALID_ARGUMENT for bad options). At world size 1 nothing is contacted.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(const GlooOptions& options);

  // May block up to the timeout if a collective was abandoned mid-flight
  // (Gloo finishes or times out its worker threads before they join).
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  absl::Status SendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  std::unique_ptr<PendingSendRecv> StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  absl::StatusOr<at::Tensor> AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                       CallKind kind) override;
  absl::Status AllReduceSum(const at::Tensor& tensor, CallKind kind) override;
  absl::Status Broadcast(const at::Tensor& tensor, int root, CallKind kind) override;
  absl::StatusOr<at::Tensor> GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes, int root,
                                          CallKind kind) override;
  absl::Status Barrier() override;
  void Abort(std::string_view reason) override;

 private:
  using Message = PointToPoint;
  // State shared with Gloo completion callbacks, which may outlive a call.
  struct Shared;

  GlooCommunicator(const GlooOptions& options);

  // Returns UNAVAILABLE once aborted.
  absl::Status CheckNotAborted() const;
  // Aborts with `status`'s message (publishing it) and returns `status`.
  absl::Status Fail(absl::Status status);
  void AbortInternal(std::string_view reason, bool publish);

  // An exchange whose messages are posted and not yet waited for.
  struct Posted {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    absl::Status status;  // a failure while posting
    std::string what;
    absl::Time deadline;
  };

  // Posts every message (tags from the per-pair sequence numbers).
  Posted Post(std::vector<Message> messages, std::string what, absl::Time deadline);
  // Waits for all of a posted exchange's messages until its deadline.
  absl::Status Finish(Posted& posted);
  // Post, then Finish.
  absl::Status Exchange(std::vector<Message> messages, std::string_view what, absl::Time deadline);
  // AllGather through Gloo's collective (GlooAllGather::kNative).
  absl::StatusOr<at::Tensor> NativeAllGather(const at::Tensor& source, absl::Span<const int64_t> sizes,
                                             const std::string& what, absl::Time deadline);
  // Waits for a Gloo collective's completion, an abort, or the deadline.
  absl::Status WaitCollective(const c10::intrusive_ptr<c10d::Work>& work, std::string_view what, absl::Time deadline);

  const int rank_;
  const int world_size_;
  const std::string group_name_;
  const absl::Duration timeout_;
  const GlooAllGather all_gather_;

  std::shared_ptr<Shared> shared_;
  // Per-pair message counters: the tag of the next message to / from a peer.
  // Touched only by the calling thread.
  std::vector<uint32_t> next_send_seq_;
  std::vector<uint32_t> next_recv_seq_;

  // Members below exist only at world size > 1. Destruction order matters:
  // the watcher (declared last) stops first, then the process group, then
  // the abandoned work that may still reference tensors.
  std::vector<c10::intrusive_ptr<c10d::Work>> abandoned_;
  std::unique_ptr<GroupStore> group_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::unique_ptr<AbortWatcher> watcher_;
};

}  // namespace vaedecode::parallel
