#include "parallel/nccl_communicator.h"

#if defined(VAEDECODE_WITH_NCCL)

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "parallel/comm_util.h"
#include "rpc/status_macros.h"
#include "spdlog/spdlog.h"

#endif  // VAEDECODE_WITH_NCCL

namespace vaedecode::parallel {

#if !defined(VAEDECODE_WITH_NCCL)

bool NcclCommunicator::CompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(const NcclOptions& options) {
  return absl::UnimplementedError("NCCL communicator: built without CUDA (build with --config=cuda)");
}

#else  // VAEDECODE_WITH_NCCL

struct NcclCommunicator::Device {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // orders the device stream after the producer's work
  int* barrier_word = nullptr;  // one device int for Barrier's all-reduce
};

namespace {

constexpr std::string_view kUniqueIdKey = "nccl_unique_id";

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(AsAbsl(what), ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return absl::OkStatus();
  }
  const char* detail = ncclGetLastError(comm);
  std::string message = absl::StrCat(AsAbsl(what), ": ", ncclGetErrorString(result));
  if (detail != nullptr && detail[0] != '\0') {
    absl::StrAppend(&message, " (", detail, ")");
  }
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return absl::InvalidArgumentError(message);
  }
  return absl::UnavailableError(message);
}

// Makes `device` current for the scope, restoring the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Sleeps a little longer each poll (from 20 us up to 1 ms): short transfers
// return quickly, long ones do not spin a core.
class Backoff {
 public:
  void Wait() {
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    delay_us_ = std::min(delay_us_ * 2, 1000);
  }

 private:
  int delay_us_ = 20;
};

// A CUDA event owned by whoever holds the last reference: the watchdog's
// work and a started exchange's join both use it.
struct CudaEvent {
  cudaEvent_t event = nullptr;
  ~CudaEvent() {
    if (event != nullptr) cudaEventDestroy(event);  // allowed while pending: freed once it completes
  }
};

bool NcclDataType(at::ScalarType type, ncclDataType_t* out) {
  switch (type) {
    case at::kFloat:
      *out = ncclFloat32;
      return true;
    case at::kDouble:
      *out = ncclFloat64;
      return true;
    case at::kHalf:
      *out = ncclFloat16;
      return true;
    case at::kBFloat16:
      *out = ncclBfloat16;
      return true;
    case at::kChar:
      *out = ncclInt8;
      return true;
    case at::kByte:
      *out = ncclUint8;
      return true;
    case at::kInt:
      *out = ncclInt32;
      return true;
    case at::kLong:
      *out = ncclInt64;
      return true;
    default:
      return false;
  }
}

size_t Bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Waits until NCCL leaves ncclInProgress on `comm` (non-blocking mode) or
// the deadline passes.
absl::Status WaitNotInProgress(ncclComm_t comm, std::string_view what, absl::Time deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclStatus(r, comm, what);
    if (state != ncclInProgress) return NcclStatus(state, comm, what);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(AsAbsl(what), ": still in progress at the deadline"));
    }
    backoff.Wait();
  }
}

}  // namespace

struct NcclCommunicator::Work {
  std::string what;
  absl::Time deadline;
  std::shared_ptr<CudaEvent> start;  // recorded on the device stream before the NCCL work
  std::shared_ptr<CudaEvent> done;   // and after it
  std::vector<at::Tensor> keep_alive;
};

bool NcclCommunicator::CompiledIn() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(const NcclOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: rank ", options.rank, " invalid for world size ", options.world_size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL: timeout must be positive");
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError("NCCL: negative device ordinal");
  }
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(options));
  if (options.world_size == 1) {
    return std::unique_ptr<Communicator>(std::move(comm));
  }
  const absl::Time deadline = absl::Now() + options.timeout;

  int device_count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&device_count), "NCCL: cudaGetDeviceCount"));
  if (options.device >= device_count) {
    return absl::UnavailableError(
        absl::StrCat("NCCL: device ", options.device, " requested, ", device_count, " visible"));
  }

  c10::intrusive_ptr<c10d::Store> store = options.store;
  if (!store) {
    TcpStoreOptions store_options;
    store_options.host = options.store_host;
    store_options.port = options.store_port;
    store_options.is_master = options.rank == 0;
    store_options.timeout = options.timeout;
    ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> tcp, ConnectTcpStore(store_options));
    store = std::move(tcp);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GroupStore> group,
                   GroupStore::Create(store, options.group_name, options.rank, options.world_size));
  comm->group_ = std::move(group);

  ncclUniqueId id;
  if (options.rank == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    RETURN_IF_ERROR(comm->group_->Set(kUniqueIdKey, std::string_view(id.internal, sizeof(id.internal))));
  }
  RETURN_IF_ERROR(comm->group_->Join(deadline));
  if (options.rank != 0) {
    ASSIGN_OR_RETURN(std::string bytes, comm->group_->WaitAndGet(kUniqueIdKey, deadline));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::InternalError("NCCL: malformed unique id in the store");
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }

  DeviceScope scope(options.device);
  if (!scope.status().ok()) return scope.status();
  auto dev = std::make_unique<Device>();
  absl::Status setup = CudaStatus(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (setup.ok()) {
    setup = CudaStatus(cudaEventCreateWithFlags(&dev->ready, cudaEventDisableTiming), "cudaEventCreate");
  }
  if (setup.ok()) {
    setup = CudaStatus(cudaMalloc(reinterpret_cast<void**>(&dev->barrier_word), sizeof(int)), "cudaMalloc");
  }
  if (setup.ok()) {
    setup = CudaStatus(cudaMemset(dev->barrier_word, 0, sizeof(int)), "cudaMemset");
  }
  if (setup.ok()) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // creation must be abortable at the deadline
    setup = NcclStatus(ncclCommInitRankConfig(&dev->comm, options.world_size, id, options.rank, &config), dev->comm,
                       "ncclCommInitRankConfig");
    if (setup.ok()) {
      setup = WaitNotInProgress(dev->comm, "ncclCommInitRankConfig", deadline);
    }
    if (!setup.ok() && dev->comm != nullptr) {
      ncclCommAbort(dev->comm);
      dev->comm = nullptr;
    }
  }
  comm->dev_ = std::move(dev);  // the destructor releases what was created
  if (!setup.ok()) {
    return absl::Status(setup.code(),
                        absl::StrCat("group '", options.group_name, "' rank ", options.rank, ": ", setup.message()));
  }

  NcclCommunicator* raw = comm.get();
  comm->watcher_ = std::make_unique<AbortWatcher>(
      comm->group_.get(), options.abort_poll_interval,
      [raw](const std::string& message) { raw->AbortInternal(message, /*publish=*/false); });
  comm->watchdog_ = std::thread([raw] { raw->WatchdogLoop(); });
  if (options.warm_up) {
    if (absl::Status warm = comm->WarmUp(); !warm.ok()) {
      return absl::Status(warm.code(), absl::StrCat("group '", options.group_name, "' rank ", options.rank,
                                                    ": first use of its connections: ", warm.message()));
    }
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

NcclCommunicator::NcclCommunicator(const NcclOptions& options)
    : rank_(options.rank),
      world_size_(options.world_size),
      device_(options.device),
      group_name_(options.group_name),
      timeout_(options.timeout),
      producer_stream_(options.producer_stream) {}

NcclCommunicator::~NcclCommunicator() {
  if (dev_ == nullptr) {
    watcher_.reset();
    return;
  }
  bool healthy;
  {
    absl::MutexLock lock(&mu_);
    healthy = !aborted_;
  }
  // Work still queued finishes first (bounded like every call).
  if (healthy) healthy = Synchronize().ok();
  {
    absl::MutexLock lock(&mu_);
    stop_watchdog_ = true;
    healthy = healthy && !aborted_;
  }
  if (watchdog_.joinable()) watchdog_.join();
  watcher_.reset();  // after the watchdog, which reports to it; no peer abort arrives from here on
  DeviceScope scope(device_);
  const absl::Time deadline = absl::Now() + timeout_;
  if (dev_->comm != nullptr) {
    bool destroyed = false;
    if (healthy) {
      // Finalize flushes outstanding work; bounded like every call.
      const ncclResult_t r = ncclCommFinalize(dev_->comm);
      if ((r == ncclSuccess || r == ncclInProgress) &&
          WaitNotInProgress(dev_->comm, "ncclCommFinalize", deadline).ok()) {
        destroyed = ncclCommDestroy(dev_->comm) == ncclSuccess;
      }
    }
    if (!destroyed) ncclCommAbort(dev_->comm);
    dev_->comm = nullptr;
  }
  // After an abort the stream may still run a kernel NCCL is tearing down,
  // reading or writing buffers. Free them only once it has drained; if it
  // does not drain in time, leak them rather than risk a use after free.
  bool drained = dev_->stream == nullptr;
  Backoff backoff;
  while (!drained) {
    const cudaError_t query = cudaStreamQuery(dev_->stream);
    if (query != cudaErrorNotReady) {
      drained = true;
      break;
    }
    if (absl::Now() >= deadline) break;
    backoff.Wait();
  }
  absl::MutexLock lock(&mu_);
  for (std::unique_ptr<Work>& work : in_flight_) {
    abandoned_.insert(abandoned_.end(), work->keep_alive.begin(), work->keep_alive.end());
  }
  in_flight_.clear();
  if (!drained) {
    spdlog::error(
        "vaedecode parallel: NCCL group '{}' rank {}: stream did not drain "
        "after abort; leaking its buffers",
        group_name_, rank_);
    (void)new std::vector<at::Tensor>(std::move(abandoned_));  // leaked
    (void)dev_.release();                                      // leaked with its stream and buffers
    return;
  }
  if (dev_->barrier_word != nullptr) cudaFree(dev_->barrier_word);
  if (dev_->ready != nullptr) cudaEventDestroy(dev_->ready);
  if (dev_->stream != nullptr) cudaStreamDestroy(dev_->stream);
  abandoned_.clear();
}

absl::Status NcclCommunicator::CheckNotAborted() const {
  absl::MutexLock lock(&mu_);
  if (!aborted_) return absl::OkStatus();
  return failure_;
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  GroupFailure failure = ExplainGroupFailure(group_.get(), group_name_, std::move(status));
  // This rank's own error is what its later calls return; a peer's reason
  // makes them return "group aborted: <reason>".
  AbortInternal(failure.abort_reason, failure.publish, failure.publish ? failure.status : absl::OkStatus());
  return std::move(failure.status);
}

void NcclCommunicator::Abort(std::string_view reason) { AbortInternal(reason, /*publish=*/true); }

void NcclCommunicator::AbortInternal(std::string_view reason, bool publish, absl::Status failure) {
  ncclComm_t to_abort = nullptr;
  size_t calls_ended = 0;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = std::string(reason);
    failure_ = !failure.ok()
                   ? failure
                   : absl::UnavailableError(absl::StrCat("group '", group_name_, "' aborted: ", AsAbsl(reason)));
    // Outside a call nobody else can be using the communicator: abort it
    // now. Inside one, the calling thread sees the flag and aborts it.
    if (!in_call_ && dev_ != nullptr) std::swap(to_abort, dev_->comm);
    // The works in flight end here: their kernels stop, and their tensors
    // wait for the stream to drain (the destructor).
    for (std::unique_ptr<Work>& work : in_flight_) {
      abandoned_.insert(abandoned_.end(), work->keep_alive.begin(), work->keep_alive.end());
    }
    calls_ended = in_flight_.size();
    in_flight_.clear();
  }
  if (to_abort != nullptr) {
    // On this rank's device: this may be the watchdog's or the abort
    // watcher's thread, and a thread without a device would create a
    // context on GPU 0 for a worker on another GPU.
    DeviceScope scope(device_);
    ncclCommAbort(to_abort);
  }
  if (watcher_ != nullptr) {
    for (size_t i = 0; i < calls_ended; ++i) watcher_->CallFinished();
  }
  if (publish && group_ != nullptr) group_->PublishAbort(reason);
  spdlog::warn("vaedecode parallel: NCCL group '{}' rank {}/{} aborted{}: {}", group_name_, rank_, world_size_,
               publish ? "" : " by a peer", reason);
}

void* NcclCommunicator::ProducerStream() const {
  if (producer_stream_) return producer_stream_();
  try {
    // LibTorch's current stream on this thread for the device: where the
    // caller's ATen kernels went.
    return c10::impl::VirtualGuardImpl(c10::kCUDA)
        .getStream(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)))
        .native_handle();
  } catch (const c10::Error&) {
    return static_cast<void*>(cudaStreamLegacy);  // a binary without LibTorch's CUDA backend
  }
}

absl::Status NcclCommunicator::Enqueue(std::string_view what, const std::function<absl::Status(const Device&)>& enqueue,
                                       std::vector<at::Tensor> keep_alive, bool join,
                                       std::function<absl::Status()>* joined) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return failure_;
    if (dev_ == nullptr || dev_->comm == nullptr) return absl::UnavailableError("NCCL communicator not formed");
    in_call_ = true;  // from here on only this thread touches dev_->comm
  }
  if (watcher_ != nullptr) watcher_->CallStarted();
  auto work = std::make_unique<Work>();
  work->what = std::string(what);
  work->deadline = absl::Now() + timeout_;
  work->keep_alive = std::move(keep_alive);
  absl::Status status;
  {
    DeviceScope scope(device_);
    status = scope.status();
    cudaStream_t producer = static_cast<cudaStream_t>(ProducerStream());
    // The transfer starts after the caller's queued work (which produced
    // the inputs and the output buffers' previous contents).
    if (status.ok()) status = CudaStatus(cudaEventRecord(dev_->ready, producer), "cudaEventRecord");
    if (status.ok()) status = CudaStatus(cudaStreamWaitEvent(dev_->stream, dev_->ready, 0), "cudaStreamWaitEvent");
    for (std::shared_ptr<CudaEvent>* event : {&work->start, &work->done}) {
      *event = std::make_shared<CudaEvent>();
      if (status.ok()) status = CudaStatus(cudaEventCreate(&(*event)->event), "cudaEventCreate");
    }
    if (status.ok()) status = CudaStatus(cudaEventRecord(work->start->event, dev_->stream), "cudaEventRecord");
    if (status.ok()) status = enqueue(*dev_);
    if (status.ok()) status = WaitNotInProgress(dev_->comm, work->what, work->deadline);
    if (status.ok()) status = CudaStatus(cudaEventRecord(work->done->event, dev_->stream), "cudaEventRecord");
    if (status.ok() && join) {
      status = CudaStatus(cudaStreamWaitEvent(producer, work->done->event, 0), "cudaStreamWaitEvent");
    }
  }
  if (status.ok() && !join && joined != nullptr) {
    *joined = [this, done = work->done]() -> absl::Status {
      RETURN_IF_ERROR(CheckNotAborted());
      DeviceScope scope(device_);
      return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(ProducerStream()), done->event, 0),
                        "cudaStreamWaitEvent");
    };
  }
  ncclComm_t to_abort = nullptr;
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    in_call_ = false;
    if (status.ok() && !aborted_) {
      in_flight_.push_back(std::move(work));
      queued = true;
    } else {
      // Also covers an Abort() that arrived while the work was queued.
      std::swap(to_abort, dev_->comm);
      if (work != nullptr) abandoned_.insert(abandoned_.end(), work->keep_alive.begin(), work->keep_alive.end());
    }
  }
  if (!queued && watcher_ != nullptr) watcher_->CallFinished();
  if (to_abort != nullptr) {
    DeviceScope scope(device_);
    ncclCommAbort(to_abort);
  }
  if (!status.ok()) return status;
  return queued ? absl::OkStatus() : CheckNotAborted();
}

void NcclCommunicator::WatchdogLoop() {
  // Every CUDA call of this thread is for this rank's device.
  cudaSetDevice(device_);
  Backoff backoff;
  while (true) {
    std::vector<std::unique_ptr<Work>> finished;
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      const auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_watchdog_ || !in_flight_.empty(); };
      if (in_flight_.empty()) {
        mu_.Await(absl::Condition(&has_work));
        backoff = Backoff();
      }
      if (stop_watchdog_) return;
      // Works complete in order on the one stream: the oldest first.
      size_t done = 0;
      for (; done < in_flight_.size(); ++done) {
        Work& work = *in_flight_[done];
        const cudaError_t query = cudaEventQuery(work.done->event);
        if (query == cudaSuccess) {
          float ms = 0;
          if (cudaEventElapsedTime(&ms, work.start->event, work.done->event) == cudaSuccess) device_call_ms_ += ms;
          continue;
        }
        if (query != cudaErrorNotReady) {
          failure = CudaStatus(query, work.what);
        } else if (absl::Now() >= work.deadline) {
          failure = absl::DeadlineExceededError(
              absl::StrCat(work.what, ": not complete within ", absl::FormatDuration(timeout_)));
        }
        break;
      }
      if (failure.ok() && done < in_flight_.size() && dev_ != nullptr && dev_->comm != nullptr) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(dev_->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
          failure = NcclStatus(async, dev_->comm, in_flight_[done]->what);
        }
      }
      for (size_t i = 0; i < done; ++i) finished.push_back(std::move(in_flight_[i]));
      in_flight_.erase(in_flight_.begin(), in_flight_.begin() + done);
    }
    // Outside the lock: tensors go back to the caching allocator.
    if (watcher_ != nullptr) {
      for (size_t i = 0; i < finished.size(); ++i) watcher_->CallFinished();
    }
    if (!finished.empty()) backoff = Backoff();
    finished.clear();
    if (!failure.ok()) {
      (void)Fail(failure);
      continue;
    }
    backoff.Wait();
  }
}

absl::Status NcclCommunicator::Synchronize() {
  if (world_size_ == 1) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // The watchdog enforces every work's deadline: past the last one plus a
  // margin, it is the watchdog that is stuck.
  const auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return aborted_ || in_flight_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&drained), timeout_ + absl::Seconds(5))) {
    return absl::DeadlineExceededError(
        absl::StrCat("group '", group_name_, "': calls in flight for longer than ", absl::FormatDuration(timeout_)));
  }
  return aborted_ ? failure_ : absl::OkStatus();
}

double NcclCommunicator::TakeDeviceCallMs() {
  absl::MutexLock lock(&mu_);
  const double ms = device_call_ms_;
  device_call_ms_ = 0;
  return ms;
}

std::function<absl::Status(const NcclCommunicator::Device&)> NcclCommunicator::EnqueueTransfers(
    const std::vector<Transfer>& transfers) {
  return [&transfers](const Device& dev) -> absl::Status {
    ncclComm_t comm = dev.comm;
    cudaStream_t stream = dev.stream;
    absl::Status status = NcclStatus(ncclGroupStart(), comm, "ncclGroupStart");
    for (const Transfer& t : transfers) {
      if (!status.ok()) break;
      const size_t bytes = Bytes(t.tensor);
      if (bytes == 0) continue;  // skipped on both ends
      status = NcclStatus(t.send ? ncclSend(t.tensor.data_ptr(), bytes, ncclUint8, t.peer, comm, stream)
                                 : ncclRecv(t.tensor.data_ptr(), bytes, ncclUint8, t.peer, comm, stream),
                          comm, t.send ? "ncclSend" : "ncclRecv");
    }
    // Always close the group, even after a failed member.
    absl::Status end = NcclStatus(ncclGroupEnd(), comm, "ncclGroupEnd");
    return status.ok() ? end : status;
  };
}

namespace {

std::vector<at::Tensor> TensorsOf(const std::vector<PointToPoint>& transfers) {
  std::vector<at::Tensor> tensors;
  tensors.reserve(transfers.size());
  for (const PointToPoint& t : transfers) tensors.push_back(t.tensor);
  return tensors;
}

}  // namespace

absl::Status NcclCommunicator::WarmUp() {
  // One byte to and from every peer (the connections NCCL opens lazily, at
  // first use), then the all-reduce path (Barrier), then wait for all of it.
  const at::Tensor bytes = at::zeros({2 * world_size_}, at::TensorOptions().dtype(at::kByte).device(device()));
  std::vector<Transfer> transfers;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    transfers.push_back(Transfer{true, peer, bytes.narrow(0, peer, 1)});
    transfers.push_back(Transfer{false, peer, bytes.narrow(0, world_size_ + peer, 1)});
  }
  if (absl::Status s = Enqueue("WarmUp", EnqueueTransfers(transfers), TensorsOf(transfers)); !s.ok()) return Fail(s);
  return Barrier();
}

absl::Status NcclCommunicator::SendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckP2POps(ops, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  if (ops.empty()) return absl::OkStatus();
  std::vector<Transfer> transfers = PointToPointOf(ops);
  absl::Status status = Enqueue(absl::StrCat("SendRecv[", AsAbsl(CallKindName(kind)), "]"), EnqueueTransfers(transfers),
                                TensorsOf(transfers));
  return status.ok() ? status : Fail(status);
}

std::unique_ptr<PendingSendRecv> NcclCommunicator::StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  absl::Status checked = CheckNotAborted();
  if (checked.ok()) checked = CheckP2POps(ops, rank_, world_size_, device());
  if (!checked.ok() || ops.empty()) return Communicator::StartSendRecv(ops, kind);
  std::vector<Transfer> transfers = PointToPointOf(ops);
  // Queued behind the work that produced the sends; the caller's next
  // kernels (on its own stream) run beside the transfers, and its stream
  // waits for them only at Wait().
  const std::string what = absl::StrCat("SendRecv[", AsAbsl(CallKindName(kind)), "]");
  std::function<absl::Status()> join;
  const absl::Status queued = Enqueue(what, EnqueueTransfers(transfers), TensorsOf(transfers), /*join=*/false, &join);
  return std::make_unique<StartedExchange>(
      what, [queued, join]() { return queued.ok() ? join() : queued; },
      [this](absl::Status status) { return Fail(status); });
}

absl::StatusOr<at::Tensor> NcclCommunicator::AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                       CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckGatherArgs(local, sizes, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  // Grouped sends and receives straight into the result's rows: exact for
  // uneven bands, no padding and no second copy.
  at::Tensor out;
  std::vector<Transfer> transfers = PlanAllGather(source, sizes, rank_, world_size_, &out);
  absl::Status status = Enqueue(absl::StrCat("AllGather[", AsAbsl(CallKindName(kind)), "]"),
                                EnqueueTransfers(transfers), TensorsOf(transfers));
  if (!status.ok()) return Fail(status);
  return out;
}

absl::StatusOr<at::Tensor> NcclCommunicator::GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                          int root, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s = CheckGatherArgs(local, sizes, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  at::Tensor out;
  std::vector<Transfer> transfers = PlanGatherToRoot(source, sizes, rank_, world_size_, root, &out);
  absl::Status status = Enqueue(absl::StrCat("GatherToRoot[", AsAbsl(CallKindName(kind)), "]"),
                                EnqueueTransfers(transfers), TensorsOf(transfers));
  if (!status.ok()) return Fail(status);
  return out;
}

absl::Status NcclCommunicator::Broadcast(const at::Tensor& tensor, int root, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s = CheckTensor(tensor, device(), "Broadcast"); !s.ok()) {
    return Fail(s);
  }
  if (world_size_ == 1 || tensor.numel() == 0) return absl::OkStatus();
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  absl::Status status = Enqueue(absl::StrCat("Broadcast[", AsAbsl(CallKindName(kind)), "]"),
                                [&](const Device& dev) -> absl::Status {
                                  return NcclStatus(ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(), Bytes(buffer),
                                                                  ncclUint8, root, dev.comm, dev.stream),
                                                    dev.comm, "ncclBroadcast");
                                },
                                {buffer});
  if (!status.ok()) return Fail(status);
  // Queued on the producer stream after it waits for the broadcast.
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllReduceSum(const at::Tensor& tensor, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckTensor(tensor, device(), "AllReduceSum"); !s.ok()) {
    return Fail(s);
  }
  ncclDataType_t type;
  if (!NcclDataType(tensor.scalar_type(), &type)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("AllReduceSum: dtype ", c10::toString(tensor.scalar_type()), " not supported by NCCL")));
  }
  if (world_size_ == 1 || tensor.numel() == 0) return absl::OkStatus();
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  absl::Status status = Enqueue(
      absl::StrCat("AllReduceSum[", AsAbsl(CallKindName(kind)), "]"),
      [&](const Device& dev) -> absl::Status {
        return NcclStatus(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), static_cast<size_t>(buffer.numel()), type,
                                        ncclSum, dev.comm, dev.stream),
                          dev.comm, "ncclAllReduce");
      },
      {buffer});
  if (!status.ok()) return Fail(status);
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  RETURN_IF_ERROR(CheckNotAborted());
  if (world_size_ == 1) return absl::OkStatus();
  absl::Status status = Enqueue("Barrier",
                                [&](const Device& dev) -> absl::Status {
                                  return NcclStatus(ncclAllReduce(dev.barrier_word, dev.barrier_word, 1, ncclInt32,
                                                                  ncclSum, dev.comm, dev.stream),
                                                    dev.comm, "ncclAllReduce (barrier)");
                                },
                                {});
  if (!status.ok()) return Fail(status);
  // A barrier is met on the host: every call before it is complete.
  return Synchronize();
}

#endif  // VAEDECODE_WITH_NCCL

}  // namespace vaedecode::parallel
