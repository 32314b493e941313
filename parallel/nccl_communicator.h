#pragma once

// Communicator over raw NCCL (GPU; production). Compiled in only with
// --config=cuda (VAEDECODE_WITH_NCCL); otherwise Create returns UNIMPLEMENTED.
// No CUDA or NCCL type appears in this header.
//
// Each rank drives one CUDA device. Transfers run on the communicator's own
// stream, ordered after the work the caller had queued on its producer
// stream (see NcclOptions::producer_stream) when the call was made; every
// call returns only after its transfers completed on the device, so results
// are ready for any stream. Timeouts: the host polls the stream and NCCL's
// asynchronous error state against the call's deadline and aborts the NCCL
// communicator (ncclCommAbort) when it expires, a peer fails, or Abort() is
// called; NCCL is initialised non-blocking so that a rank that never joins
// cannot hang creation either.

#include <functional>
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

struct ncclComm;  // nccl.h's communicator handle (ncclComm_t), CUDA builds only

namespace vaedecode::parallel {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  // CUDA device ordinal this rank uses; tensors passed in must live there.
  int device = 0;
  // As GlooOptions: group keys in the store, unique per incarnation.
  std::string group_name = "default";
  absl::Duration timeout = absl::Seconds(60);

  // Rendezvous for the ncclUniqueId (rank 0 creates it and publishes it):
  // `store` if set, else a TCPStore at store_host:store_port hosted by rank 0.
  c10::intrusive_ptr<c10d::Store> store;
  std::string store_host = "127.0.0.1";
  int store_port = 0;

  absl::Duration abort_poll_interval = absl::Milliseconds(100);

  // Returns the cudaStream_t (as void*) the caller's kernels are queued on at
  // the time of a call, e.g. c10::cuda::getCurrentCUDAStream().stream() in a
  // CUDA LibTorch build. Unset: the legacy default stream, which is
  // LibTorch's current stream unless the caller changed it.
  std::function<void*()> producer_stream;
};

class NcclCommunicator final : public Communicator {
 public:
  // Whether this binary was built with NCCL (--config=cuda).
  static bool CompiledIn();

  // Joins the group and initialises NCCL, within about options.timeout. At
  // world size 1 no CUDA or NCCL call is made. UNIMPLEMENTED ("built without
  // CUDA") in builds without --config=cuda; UNAVAILABLE if the device is
  // missing or CUDA cannot start.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      const NcclOptions& options);

  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

  absl::Status SendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  std::unique_ptr<PendingSendRecv> StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) override;
  absl::StatusOr<at::Tensor> AllGather(const at::Tensor& local,
                                       absl::Span<const int64_t> sizes,
                                       CallKind kind) override;
  absl::Status AllReduceSum(const at::Tensor& tensor, CallKind kind) override;
  absl::Status Broadcast(const at::Tensor& tensor, int root,
                         CallKind kind) override;
  absl::StatusOr<at::Tensor> GatherToRoot(const at::Tensor& local,
                                          absl::Span<const int64_t> sizes,
                                          int root, CallKind kind) override;
  absl::Status Barrier() override;
  void Abort(std::string_view reason) override;

 private:
  // CUDA / NCCL handles; defined in the .cc (CUDA builds only).
  struct Device;
  // One queued point-to-point transfer of a grouped exchange.
  using Transfer = PointToPoint;

  explicit NcclCommunicator(const NcclOptions& options);

  absl::Status CheckNotAborted() const;
  absl::Status Fail(absl::Status status);
  void AbortInternal(std::string_view reason, bool publish);

  // Orders the device stream after the producer stream, runs `enqueue`
  // (which queues NCCL work on the device stream), then waits for it to
  // finish, fail, be aborted or pass `deadline`. On failure the NCCL
  // communicator is aborted and `keep_alive` is held until destruction.
  absl::Status Run(std::string_view what,
                   const std::function<absl::Status(const Device&)>& enqueue,
                   std::vector<at::Tensor> keep_alive, absl::Time deadline);
  // A call that Begin queued and End has not finished: while it is in
  // progress this thread owns the NCCL communicator (in_call_).
  struct Call {
    std::string what;
    ncclComm* comm = nullptr;  // ncclComm_t
    std::vector<at::Tensor> keep_alive;
    absl::Time deadline;
    absl::Status status;  // a failure while queueing
    bool owns = false;    // Begin took the communicator; End gives it back
  };
  // Run in two halves: Begin queues the work, End waits for it (and aborts
  // NCCL on failure), so that a caller may compute in between.
  Call Begin(std::string_view what, const std::function<absl::Status(const Device&)>& enqueue,
             std::vector<at::Tensor> keep_alive, absl::Time deadline);
  absl::Status End(Call& call);
  // Queues a grouped set of sends and receives on the device's stream.
  static std::function<absl::Status(const Device&)> EnqueueTransfers(const std::vector<Transfer>& transfers);
  // A grouped set of sends and receives through Run.
  absl::Status RunTransfers(std::string_view what,
                            std::vector<Transfer> transfers,
                            absl::Time deadline);

  const int rank_;
  const int world_size_;
  const int device_;
  const std::string group_name_;
  const absl::Duration timeout_;
  const std::function<void*()> producer_stream_;

  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  // A call owns the NCCL communicator while it runs; Abort() from another
  // thread then only flags it and the call aborts NCCL itself.
  bool in_call_ ABSL_GUARDED_BY(mu_) = false;

  // Tensors NCCL may still touch after a failed call.
  std::vector<at::Tensor> abandoned_;
  std::unique_ptr<GroupStore> group_;
  // Its comm handle is used by the calling thread during a call, and
  // swapped out under mu_ by whoever aborts NCCL.
  std::unique_ptr<Device> dev_;
  std::unique_ptr<AbortWatcher> watcher_;  // last: stops first
};

}  // namespace vaedecode::parallel
