#include "parallel/nccl_communicator.h"

#if defined(VAEDECODE_WITH_NCCL)

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "parallel/comm_util.h"
#include "spdlog/spdlog.h"

#endif  // VAEDECODE_WITH_NCCL

namespace vaedecode::parallel {

#if !defined(VAEDECODE_WITH_NCCL)

bool NcclCommunicator::CompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(
    const NcclOptions& options) {
  return absl::UnimplementedError(
      "NCCL communicator: built without CUDA (build with --config=cuda)");
}

#else  // VAEDECODE_WITH_NCCL

struct NcclCommunicator::Device {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  int* barrier_word = nullptr;  // one device int for Barrier's all-reduce
};

namespace {

constexpr std::string_view kUniqueIdKey = "nccl_unique_id";

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(AsAbsl(what), ": ",
                                             cudaGetErrorName(error), ": ",
                                             cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm,
                        std::string_view what) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return absl::OkStatus();
  }
  const char* detail = ncclGetLastError(comm);
  std::string message =
      absl::StrCat(AsAbsl(what), ": ", ncclGetErrorString(result));
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

size_t Bytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Waits until NCCL leaves ncclInProgress on `comm` (non-blocking mode) or
// the deadline passes.
absl::Status WaitNotInProgress(ncclComm_t comm, std::string_view what,
                               absl::Time deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclStatus(r, comm, what);
    if (state != ncclInProgress) return NcclStatus(state, comm, what);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(AsAbsl(what), ": still in progress at the deadline"));
    }
    backoff.Wait();
  }
}

}  // namespace

bool NcclCommunicator::CompiledIn() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(
    const NcclOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL: rank ", options.rank,
                                                   " invalid for world size ",
                                                   options.world_size));
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
  if (absl::Status s = CudaStatus(cudaGetDeviceCount(&device_count),
                                  "NCCL: cudaGetDeviceCount");
      !s.ok()) {
    return s;
  }
  if (options.device >= device_count) {
    return absl::UnavailableError(absl::StrCat("NCCL: device ", options.device,
                                               " requested, ", device_count,
                                               " visible"));
  }

  c10::intrusive_ptr<c10d::Store> store = options.store;
  if (!store) {
    TcpStoreOptions store_options;
    store_options.host = options.store_host;
    store_options.port = options.store_port;
    store_options.is_master = options.rank == 0;
    store_options.timeout = options.timeout;
    absl::StatusOr<c10::intrusive_ptr<c10d::Store>> tcp =
        ConnectTcpStore(store_options);
    if (!tcp.ok()) return tcp.status();
    store = *std::move(tcp);
  }
  absl::StatusOr<std::unique_ptr<GroupStore>> group = GroupStore::Create(
      store, options.group_name, options.rank, options.world_size);
  if (!group.ok()) return group.status();
  comm->group_ = *std::move(group);

  ncclUniqueId id;
  if (options.rank == 0) {
    if (absl::Status s =
            NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = comm->group_->Set(
            kUniqueIdKey, std::string_view(id.internal, sizeof(id.internal)));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = comm->group_->Join(deadline); !s.ok()) return s;
  if (options.rank != 0) {
    absl::StatusOr<std::string> bytes =
        comm->group_->WaitAndGet(kUniqueIdKey, deadline);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() != sizeof(id.internal)) {
      return absl::InternalError("NCCL: malformed unique id in the store");
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  DeviceScope scope(options.device);
  if (!scope.status().ok()) return scope.status();
  auto dev = std::make_unique<Device>();
  absl::Status setup =
      CudaStatus(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
  if (setup.ok()) {
    setup = CudaStatus(
        cudaEventCreateWithFlags(&dev->ready, cudaEventDisableTiming),
        "cudaEventCreate");
  }
  if (setup.ok()) {
    setup = CudaStatus(
        cudaMalloc(reinterpret_cast<void**>(&dev->barrier_word), sizeof(int)),
        "cudaMalloc");
  }
  if (setup.ok()) {
    setup =
        CudaStatus(cudaMemset(dev->barrier_word, 0, sizeof(int)), "cudaMemset");
  }
  if (setup.ok()) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // creation must be abortable at the deadline
    setup = NcclStatus(ncclCommInitRankConfig(&dev->comm, options.world_size,
                                              id, options.rank, &config),
                       dev->comm, "ncclCommInitRankConfig");
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
                        absl::StrCat("group '", options.group_name, "' rank ",
                                     options.rank, ": ", setup.message()));
  }

  NcclCommunicator* raw = comm.get();
  comm->watcher_ = std::make_unique<AbortWatcher>(
      comm->group_.get(), options.abort_poll_interval,
      [raw](const std::string& message) {
        raw->AbortInternal(message, /*publish=*/false);
      });
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
  watcher_.reset();
  if (dev_ == nullptr) return;
  DeviceScope scope(device_);
  bool healthy;
  {
    absl::MutexLock lock(&mu_);
    healthy = !aborted_;
  }
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
  if (!drained) {
    spdlog::error(
        "vaedecode parallel: NCCL group '{}' rank {}: stream did not drain "
        "after abort; leaking its buffers",
        group_name_, rank_);
    (void)new std::vector<at::Tensor>(std::move(abandoned_));  // leaked
    (void)dev_.release();  // leaked with its stream and buffers
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
  return absl::UnavailableError(
      absl::StrCat("group '", group_name_, "' aborted: ", abort_reason_));
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  // A transport error ("connection closed") is often only the echo of a
  // peer's failure; if that peer published why, report its reason.
  if (group_ != nullptr &&
      status.code() != absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<std::optional<std::string>> peer = group_->CheckAbort();
    if (peer.ok() && peer->has_value()) {
      AbortInternal(**peer, /*publish=*/false);
      return absl::UnavailableError(
          absl::StrCat("group '", group_name_, "' aborted: ", **peer,
                       " (here: ", status.message(), ")"));
    }
  }
  AbortInternal(status.ToString(), /*publish=*/true);
  return status;
}

void NcclCommunicator::Abort(std::string_view reason) {
  AbortInternal(reason, /*publish=*/true);
}

void NcclCommunicator::AbortInternal(std::string_view reason, bool publish) {
  ncclComm_t to_abort = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = std::string(reason);
    // Outside a call nobody else can be using the communicator: abort it
    // now. Inside one, the calling thread sees the flag and aborts it.
    if (!in_call_ && dev_ != nullptr) std::swap(to_abort, dev_->comm);
  }
  if (to_abort != nullptr) ncclCommAbort(to_abort);
  if (publish && group_ != nullptr) group_->PublishAbort(reason);
  spdlog::warn("vaedecode parallel: NCCL group '{}' rank {}/{} aborted{}: {}",
               group_name_, rank_, world_size_, publish ? "" : " by a peer",
               reason);
}

NcclCommunicator::Call NcclCommunicator::Begin(std::string_view what,
                                               const std::function<absl::Status(const Device&)>& enqueue,
                                               std::vector<at::Tensor> keep_alive, absl::Time deadline) {
  Call call;
  call.what = std::string(what);
  call.keep_alive = std::move(keep_alive);
  call.deadline = deadline;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_ || dev_ == nullptr || dev_->comm == nullptr) {
      call.status = absl::UnavailableError(
          absl::StrCat("group '", group_name_, "' aborted: ", abort_reason_));
      return call;
    }
    in_call_ = true;  // from here on only this thread touches dev_->comm
    call.comm = dev_->comm;
  }
  call.owns = true;
  if (watcher_ != nullptr) watcher_->CallStarted();
  DeviceScope scope(device_);
  call.status = scope.status();
  if (call.status.ok()) {
    // The transfer stream starts after the caller's queued work (which
    // produced the inputs and the output buffers' previous contents).
    cudaStream_t producer =
        producer_stream_ ? static_cast<cudaStream_t>(producer_stream_())
                         : cudaStreamLegacy;
    call.status =
        CudaStatus(cudaEventRecord(dev_->ready, producer), "cudaEventRecord");
    if (call.status.ok()) {
      call.status = CudaStatus(cudaStreamWaitEvent(dev_->stream, dev_->ready, 0),
                               "cudaStreamWaitEvent");
    }
  }
  if (call.status.ok()) call.status = enqueue(*dev_);
  if (call.status.ok()) call.status = WaitNotInProgress(call.comm, call.what, deadline);
  return call;
}

absl::Status NcclCommunicator::End(Call& call) {
  if (!call.owns) return call.status;
  call.owns = false;
  absl::Status status = call.status;
  {
    DeviceScope scope(device_);
    if (status.ok()) status = scope.status();
    Backoff backoff;
    while (status.ok()) {
      const cudaError_t query = cudaStreamQuery(dev_->stream);
      if (query == cudaSuccess) break;
      if (query != cudaErrorNotReady) {
        status = CudaStatus(query, call.what);
        break;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(call.comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        status = NcclStatus(async, call.comm, call.what);
        break;
      }
      status = CheckNotAborted();
      if (!status.ok()) break;
      if (absl::Now() >= call.deadline) {
        status = absl::DeadlineExceededError(
            absl::StrCat(AsAbsl(call.what), ": not complete within ",
                         absl::FormatDuration(timeout_)));
        break;
      }
      backoff.Wait();
    }
  }

  ncclComm_t to_abort = nullptr;
  {
    absl::MutexLock lock(&mu_);
    in_call_ = false;
    // Also covers an Abort() that arrived while the call was running.
    if (!status.ok() || aborted_) std::swap(to_abort, dev_->comm);
  }
  if (watcher_ != nullptr) watcher_->CallFinished();
  if (to_abort != nullptr) {
    DeviceScope scope(device_);
    ncclCommAbort(to_abort);
  }
  if (!status.ok()) {
    abandoned_.insert(abandoned_.end(),
                      std::make_move_iterator(call.keep_alive.begin()),
                      std::make_move_iterator(call.keep_alive.end()));
  }
  call.keep_alive.clear();
  return status;
}

absl::Status NcclCommunicator::Run(
    std::string_view what,
    const std::function<absl::Status(const Device&)>& enqueue,
    std::vector<at::Tensor> keep_alive, absl::Time deadline) {
  Call call = Begin(what, enqueue, std::move(keep_alive), deadline);
  return End(call);
}

std::function<absl::Status(const NcclCommunicator::Device&)> NcclCommunicator::EnqueueTransfers(
    const std::vector<Transfer>& transfers) {
  return [&transfers](const Device& dev) -> absl::Status {
    ncclComm_t comm = dev.comm;
    cudaStream_t stream = dev.stream;
    absl::Status status =
        NcclStatus(ncclGroupStart(), comm, "ncclGroupStart");
    for (const Transfer& t : transfers) {
      if (!status.ok()) break;
      const size_t bytes = Bytes(t.tensor);
      if (bytes == 0) continue;  // skipped on both ends
      status =
          NcclStatus(t.send ? ncclSend(t.tensor.data_ptr(), bytes,
                                       ncclUint8, t.peer, comm, stream)
                            : ncclRecv(t.tensor.data_ptr(), bytes,
                                       ncclUint8, t.peer, comm, stream),
                     comm, t.send ? "ncclSend" : "ncclRecv");
    }
    // Always close the group, even after a failed member.
    absl::Status end = NcclStatus(ncclGroupEnd(), comm, "ncclGroupEnd");
    return status.ok() ? end : status;
  };
}

absl::Status NcclCommunicator::RunTransfers(std::string_view what,
                                            std::vector<Transfer> transfers,
                                            absl::Time deadline) {
  std::vector<at::Tensor> keep_alive;
  keep_alive.reserve(transfers.size());
  for (const Transfer& t : transfers) keep_alive.push_back(t.tensor);
  return Run(what, EnqueueTransfers(transfers), std::move(keep_alive), deadline);
}

absl::Status NcclCommunicator::SendRecv(absl::Span<const P2POp> ops,
                                        CallKind kind) {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (absl::Status s = CheckP2POps(ops, rank_, world_size_, device());
      !s.ok()) {
    return Fail(s);
  }
  if (ops.empty()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status status =
      RunTransfers(absl::StrCat("SendRecv[", AsAbsl(CallKindName(kind)), "]"),
                   PointToPointOf(ops), deadline);
  return status.ok() ? status : Fail(status);
}

std::unique_ptr<PendingSendRecv> NcclCommunicator::StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  absl::Status checked = CheckNotAborted();
  if (checked.ok()) checked = CheckP2POps(ops, rank_, world_size_, device());
  if (!checked.ok() || ops.empty()) return Communicator::StartSendRecv(ops, kind);
  std::vector<Transfer> transfers = PointToPointOf(ops);
  std::vector<at::Tensor> keep_alive;
  keep_alive.reserve(transfers.size());
  for (const Transfer& t : transfers) keep_alive.push_back(t.tensor);
  // The transfers are queued on the communicator's stream behind the work
  // that produced their inputs; the caller's next kernels (on its own
  // stream) run beside them until Wait() finds the stream drained.
  auto call = std::make_shared<Call>(Begin(absl::StrCat("SendRecv[", AsAbsl(CallKindName(kind)), "]"),
                                           EnqueueTransfers(transfers), std::move(keep_alive),
                                           absl::Now() + timeout_));
  const std::string what = call->what;
  return std::make_unique<StartedExchange>(
      what, [this, call] { return End(*call); }, [this](absl::Status status) { return Fail(status); });
}

absl::StatusOr<at::Tensor> NcclCommunicator::AllGather(
    const at::Tensor& local, absl::Span<const int64_t> sizes, CallKind kind) {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (absl::Status s =
          CheckGatherArgs(local, sizes, rank_, world_size_, device());
      !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  const absl::Time deadline = absl::Now() + timeout_;
  // Grouped sends and receives straight into the result's rows: exact for
  // uneven bands, no padding and no second copy.
  at::Tensor out;
  std::vector<Transfer> transfers = PlanAllGather(source, sizes, rank_, world_size_, &out);
  absl::Status status =
      RunTransfers(absl::StrCat("AllGather[", AsAbsl(CallKindName(kind)), "]"),
                   std::move(transfers), deadline);
  if (!status.ok()) return Fail(status);
  return out;
}

absl::StatusOr<at::Tensor> NcclCommunicator::GatherToRoot(
    const at::Tensor& local, absl::Span<const int64_t> sizes, int root,
    CallKind kind) {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s =
          CheckGatherArgs(local, sizes, rank_, world_size_, device());
      !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  const absl::Time deadline = absl::Now() + timeout_;
  at::Tensor out;
  std::vector<Transfer> transfers = PlanGatherToRoot(source, sizes, rank_, world_size_, root, &out);
  absl::Status status = RunTransfers(
      absl::StrCat("GatherToRoot[", AsAbsl(CallKindName(kind)), "]"),
      std::move(transfers), deadline);
  if (!status.ok()) return Fail(status);
  return out;
}

absl::Status NcclCommunicator::Broadcast(const at::Tensor& tensor, int root,
                                         CallKind kind) {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s = CheckTensor(tensor, device(), "Broadcast"); !s.ok()) {
    return Fail(s);
  }
  if (world_size_ == 1 || tensor.numel() == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  absl::Status status = Run(
      absl::StrCat("Broadcast[", AsAbsl(CallKindName(kind)), "]"),
      [&](const Device& dev) -> absl::Status {
        return NcclStatus(
            ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(), Bytes(buffer),
                          ncclUint8, root, dev.comm, dev.stream),
            dev.comm, "ncclBroadcast");
      },
      {buffer}, deadline);
  if (!status.ok()) return Fail(status);
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllReduceSum(const at::Tensor& tensor,
                                            CallKind kind) {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (absl::Status s = CheckTensor(tensor, device(), "AllReduceSum"); !s.ok()) {
    return Fail(s);
  }
  ncclDataType_t type;
  if (!NcclDataType(tensor.scalar_type(), &type)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "AllReduceSum: dtype ", c10::toString(tensor.scalar_type()),
        " not supported by NCCL")));
  }
  if (world_size_ == 1 || tensor.numel() == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  absl::Status status = Run(
      absl::StrCat("AllReduceSum[", AsAbsl(CallKindName(kind)), "]"),
      [&](const Device& dev) -> absl::Status {
        return NcclStatus(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(),
                                        static_cast<size_t>(buffer.numel()),
                                        type, ncclSum, dev.comm, dev.stream),
                          dev.comm, "ncclAllReduce");
      },
      {buffer}, deadline);
  if (!status.ok()) return Fail(status);
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  if (absl::Status s = CheckNotAborted(); !s.ok()) return s;
  if (world_size_ == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status status = Run(
      "Barrier",
      [&](const Device& dev) -> absl::Status {
        return NcclStatus(
            ncclAllReduce(dev.barrier_word, dev.barrier_word, 1, ncclInt32,
                          ncclSum, dev.comm, dev.stream),
            dev.comm, "ncclAllReduce (barrier)");
      },
      {}, deadline);
  return status.ok() ? status : Fail(status);
}

#endif  // VAEDECODE_WITH_NCCL

}  // namespace vaedecode::parallel
