#pragma once

// Communicator over raw NCCL (GPU; production). Compiled in only with
// --config=cuda (VAEDECODE_WITH_NCCL); otherwise Create returns UNIMPLEMENTED.
// No CUDA or NCCL type appears in this header.
//
// Each rank drives one CUDA device. Calls are asynchronous, as
// ProcessGroupNCCL's: a call queues its NCCL work on the communicator's own
// stream behind the work the caller had queued on its producer stream
// (NcclOptions::producer_stream), makes the producer stream wait for it with
// an event, and returns; results are ready for any work queued on the
// producer stream afterwards (and for the host once that stream is synced),
// while the host goes on queueing compute. A started SendRecv joins the
// producer stream only at its Wait(), so compute queued in between runs
// beside the transfer. The tensors a call uses are held until the device
// is done with them. A watchdog thread follows the calls in flight: it
// times them with CUDA events (TakeDeviceCallMs), releases their tensors,
// and aborts the NCCL communicator (ncclCommAbort) when one passes its
// deadline, NCCL reports an asynchronous error, a peer publishes an abort,
// or Abort() is called; a failure then surfaces at the next call or at
// Synchronize(). NCCL is initialised non-blocking so that a rank that never
// joins cannot hang creation either; once formed, every connection and the
// all-reduce path are used once (so NCCL's lazily allocated buffers exist
// before a decode measures its memory).
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
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
  // the time of a call. Unset: LibTorch's current stream for `device` on the
  // calling thread (c10's, the stream every ATen kernel of that thread uses).
  std::function<void*()> producer_stream;

  // Make the first use of every connection at creation (warming NCCL's
  // lazily allocated buffers). Off only for tests of creation itself.
  bool warm_up = true;
};

class NcclCommunicator final : public Communicator {
 public:
  // Whether this binary was built with NCCL (--config=cuda).
  static bool CompiledIn();

  // Joins the group and initialises NCCL, within about options.timeout. At
  // world size 1 no CUDA or NCCL call is made. UNIMPLEMENTED ("built without
  // CUDA") in builds without --config=cuda; UNAVAILABLE if the device is
  // missing or CUDA cannot start.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(const NcclOptions& options);

  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)); }

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
  // Waits until every call made so far has completed on the device (or the
  // communicator aborted): the first failure, or OK.
  absl::Status Synchronize() override;
  // The device time of the calls completed since the last call (between the
  // events around each call's NCCL work: transfers and waiting for peers).
  double TakeDeviceCallMs() override;

 private:
  // CUDA / NCCL handles; defined in the .cc (CUDA builds only).
  struct Device;
  // One call queued on the device and not yet seen complete.
  struct Work;
  // One queued point-to-point transfer of a grouped exchange.
  using Transfer = PointToPoint;

  explicit NcclCommunicator(const NcclOptions& options);

  absl::Status CheckNotAborted() const;
  absl::Status Fail(absl::Status status);
  void AbortInternal(std::string_view reason, bool publish, absl::Status failure = absl::OkStatus());

  // Queues `enqueue`'s NCCL work on the device stream after the producer
  // stream's work, between timing events, and hands it to the watchdog,
  // which holds `keep_alive` until the work is done. With `join`, the
  // producer stream waits for the work at once; otherwise `*joined` gets a
  // function that makes it wait (a started SendRecv's Wait).
  absl::Status Enqueue(std::string_view what, const std::function<absl::Status(const Device&)>& enqueue,
                       std::vector<at::Tensor> keep_alive, bool join = true,
                       std::function<absl::Status()>* joined = nullptr);
  // Queues a grouped set of sends and receives on the device's stream.
  static std::function<absl::Status(const Device&)> EnqueueTransfers(const std::vector<Transfer>& transfers);
  // The producer stream (cudaStream_t) for a call made now.
  void* ProducerStream() const;
  // Uses every connection once (a send to and a receive from every peer)
  // and the all-reduce path.
  absl::Status WarmUp();
  // The watchdog: follows the works in flight until the destructor stops it.
  void WatchdogLoop();

  const int rank_;
  const int world_size_;
  const int device_;
  const std::string group_name_;
  const absl::Duration timeout_;
  const std::function<void*()> producer_stream_;

  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // the status to report after the abort
  // A call owns the NCCL communicator while it queues work; Abort() from
  // another thread then only flags it and the call aborts NCCL itself.
  bool in_call_ ABSL_GUARDED_BY(mu_) = false;
  // Calls queued and not seen complete by the watchdog, oldest first.
  std::vector<std::unique_ptr<Work>> in_flight_ ABSL_GUARDED_BY(mu_);
  double device_call_ms_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_watchdog_ ABSL_GUARDED_BY(mu_) = false;

  // Tensors NCCL may still touch after an abort, freed once the stream drained.
  std::vector<at::Tensor> abandoned_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GroupStore> group_;
  // Its comm handle is used by the calling thread while it queues work, and
  // swapped out under mu_ by whoever aborts NCCL.
  std::unique_ptr<Device> dev_;
  std::thread watchdog_;
  std::unique_ptr<AbortWatcher> watcher_;  // last: stops first
};

}  // namespace vaedecode::parallel
