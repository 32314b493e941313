#include "parallel/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/strings/str_cat.h"
#include "parallel/comm_util.h"
#include "rpc/status_macros.h"
#include "spdlog/spdlog.h"

namespace vaedecode::parallel {

struct GlooCommunicator::Shared {
  absl::Mutex mu;
  absl::CondVar cv;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::string reason ABSL_GUARDED_BY(mu);
  // Point-to-point work being waited on; Abort() interrupts their waits.
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight ABSL_GUARDED_BY(mu);
};

namespace {

// Brackets a call that may block on peers, for the abort watcher.
class InFlight {
 public:
  explicit InFlight(AbortWatcher* watcher) : watcher_(watcher) {
    if (watcher_ != nullptr) watcher_->CallStarted();
  }
  ~InFlight() {
    if (watcher_ != nullptr) watcher_->CallFinished();
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  AbortWatcher* const watcher_;
};

// Dtypes ProcessGroupGloo reduces natively here (bf16 is summed in fp32).
bool GlooReducesNatively(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

void IgnoreSigpipeIfDefault() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (current.sa_handler != SIG_DFL) return;  // the program chose already
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::Create(const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gloo: rank ", options.rank, " invalid for world size ", options.world_size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Gloo: timeout must be positive");
  }
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(options));
  if (options.world_size == 1) return std::unique_ptr<Communicator>(std::move(comm));

  const absl::Time deadline = absl::Now() + options.timeout;
  if (options.ignore_sigpipe) IgnoreSigpipeIfDefault();
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
  RETURN_IF_ERROR(comm->group_->Join(deadline));

  try {
    auto gloo_options =
        c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_host));
    comm->pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(comm->group_->store(), options.rank, options.world_size,
                                                            gloo_options);
  } catch (...) {
    return StatusFromException(std::current_exception(),
                               absl::StrCat("group '", options.group_name, "' rank ", options.rank, ": Gloo connect"),
                               deadline);
  }

  GlooCommunicator* raw = comm.get();
  comm->watcher_ = std::make_unique<AbortWatcher>(
      comm->group_.get(), options.abort_poll_interval,
      [raw](const std::string& message) { raw->AbortInternal(message, /*publish=*/false); });
  return std::unique_ptr<Communicator>(std::move(comm));
}

GlooCommunicator::GlooCommunicator(const GlooOptions& options)
    : rank_(options.rank),
      world_size_(options.world_size),
      group_name_(options.group_name),
      timeout_(options.timeout),
      all_gather_(options.all_gather),
      shared_(std::make_shared<Shared>()),
      next_send_seq_(options.world_size, 0),
      next_recv_seq_(options.world_size, 0) {}

GlooCommunicator::~GlooCommunicator() {
  // The watcher may be calling AbortInternal; stop it before anything it
  // touches goes away.
  watcher_.reset();
  pg_.reset();
  abandoned_.clear();
}

absl::Status GlooCommunicator::CheckNotAborted() const {
  absl::MutexLock lock(&shared_->mu);
  if (!shared_->aborted) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("group '", group_name_, "' aborted: ", shared_->reason));
}

absl::Status GlooCommunicator::Fail(absl::Status status) {
  GroupFailure failure = ExplainGroupFailure(group_.get(), group_name_, std::move(status));
  AbortInternal(failure.abort_reason, failure.publish);
  return std::move(failure.status);
}

void GlooCommunicator::Abort(std::string_view reason) { AbortInternal(reason, /*publish=*/true); }

void GlooCommunicator::AbortInternal(std::string_view reason, bool publish) {
  std::vector<c10::intrusive_ptr<c10d::Work>> to_interrupt;
  {
    absl::MutexLock lock(&shared_->mu);
    if (shared_->aborted) return;
    shared_->aborted = true;
    shared_->reason = std::string(reason);
    to_interrupt = shared_->in_flight;
    shared_->cv.SignalAll();
  }
  for (const auto& work : to_interrupt) {
    try {
      work->abort();
    } catch (...) {
      // Work types without abort: their waits end at the deadline.
    }
  }
  if (publish && group_ != nullptr) group_->PublishAbort(reason);
  spdlog::warn("vaedecode parallel: group '{}' rank {}/{} aborted{}: {}", group_name_, rank_, world_size_,
               publish ? "" : " by a peer", reason);
}

GlooCommunicator::Posted GlooCommunicator::Post(std::vector<Message> messages, std::string what, absl::Time deadline) {
  Posted posted;
  posted.what = std::move(what);
  posted.deadline = deadline;
  posted.works.reserve(messages.size());
  try {
    for (Message& m : messages) {
      // Both ends count every message, sent or skipped, so tags stay aligned.
      const uint32_t seq = m.send ? next_send_seq_[m.peer]++ : next_recv_seq_[m.peer]++;
      if (m.tensor.numel() == 0) continue;
      const int tag = static_cast<int>(seq & 0x3fffffffu);
      std::vector<at::Tensor> tensors{m.tensor};
      posted.works.push_back(m.send ? pg_->send(tensors, m.peer, tag) : pg_->recv(tensors, m.peer, tag));
    }
  } catch (...) {
    posted.status =
        StatusFromException(std::current_exception(), absl::StrCat(AsAbsl(posted.what), ": post"), deadline);
  }

  bool aborted_before_wait = false;
  {
    absl::MutexLock lock(&shared_->mu);
    aborted_before_wait = shared_->aborted;
    shared_->in_flight.insert(shared_->in_flight.end(), posted.works.begin(), posted.works.end());
  }
  if (aborted_before_wait) {
    for (const auto& work : posted.works) {
      try {
        work->abort();
      } catch (...) {
      }
    }
  }
  return posted;
}

absl::Status GlooCommunicator::Finish(Posted& posted) {
  InFlight in_flight(watcher_.get());
  absl::Status status = posted.status;
  for (const auto& work : posted.works) {
    if (!status.ok()) break;
    try {
      if (!work->wait(RemainingMillis(posted.deadline))) {
        status = CheckNotAborted();
        if (status.ok()) status = absl::UnavailableError(absl::StrCat(AsAbsl(posted.what), ": interrupted"));
      }
    } catch (...) {
      status = StatusFromException(std::current_exception(), posted.what, posted.deadline);
    }
  }
  if (status.ok()) status = CheckNotAborted();

  {
    absl::MutexLock lock(&shared_->mu);
    auto& pending = shared_->in_flight;
    for (const auto& work : posted.works) {
      for (auto it = pending.begin(); it != pending.end(); ++it) {
        if (*it == work) {
          pending.erase(it);
          break;
        }
      }
    }
  }
  if (!status.ok()) {
    // Gloo may still write into (or read from) these tensors; keep them
    // alive until the process group is gone.
    abandoned_.insert(abandoned_.end(), posted.works.begin(), posted.works.end());
  }
  posted.works.clear();
  return status;
}

absl::Status GlooCommunicator::Exchange(std::vector<Message> messages, std::string_view what, absl::Time deadline) {
  Posted posted = Post(std::move(messages), std::string(what), deadline);
  return Finish(posted);
}

absl::Status GlooCommunicator::WaitCollective(const c10::intrusive_ptr<c10d::Work>& work, std::string_view what,
                                              absl::Time deadline) {
  InFlight in_flight(watcher_.get());
  auto done = std::make_shared<bool>(false);
  std::shared_ptr<Shared> shared = shared_;
  try {
    work->getFuture()->addCallback([shared, done](c10::ivalue::Future&) {
      absl::MutexLock lock(&shared->mu);
      *done = true;
      shared->cv.SignalAll();
    });
  } catch (...) {
    abandoned_.push_back(work);
    return StatusFromException(std::current_exception(), what, deadline);
  }
  {
    absl::MutexLock lock(&shared->mu);
    while (!*done && !shared->aborted) {
      if (shared->cv.WaitWithDeadline(&shared->mu, deadline)) break;
    }
    if (!*done) {
      abandoned_.push_back(work);
      if (shared->aborted) {
        return absl::UnavailableError(
            absl::StrCat(AsAbsl(what), ": group '", group_name_, "' aborted: ", shared->reason));
      }
      return absl::DeadlineExceededError(
          absl::StrCat(AsAbsl(what), ": no completion within ", absl::FormatDuration(timeout_)));
    }
  }
  try {
    work->wait();  // completed: returns at once, or rethrows its error
  } catch (...) {
    return StatusFromException(std::current_exception(), what, deadline);
  }
  return absl::OkStatus();
}

namespace {

std::string SendRecvName(CallKind kind) { return absl::StrCat("SendRecv[", AsAbsl(CallKindName(kind)), "]"); }

}  // namespace

absl::Status GlooCommunicator::SendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckP2POps(ops, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  if (ops.empty()) return absl::OkStatus();
  absl::Status status = Exchange(PointToPointOf(ops), SendRecvName(kind), absl::Now() + timeout_);
  return status.ok() ? status : Fail(status);
}

std::unique_ptr<PendingSendRecv> GlooCommunicator::StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  absl::Status checked = CheckNotAborted();
  if (checked.ok()) checked = CheckP2POps(ops, rank_, world_size_, device());
  if (!checked.ok() || ops.empty()) {
    // Nothing posted: the default (synchronous) call reports it alike.
    return Communicator::StartSendRecv(ops, kind);
  }
  // Gloo's transport threads move the posted messages while the caller
  // computes; Wait() finishes them as SendRecv would.
  auto posted = std::make_shared<Posted>(Post(PointToPointOf(ops), SendRecvName(kind), absl::Now() + timeout_));
  const std::string what = posted->what;
  return std::make_unique<StartedExchange>(
      what, [this, posted] { return Finish(*posted); }, [this](absl::Status status) { return Fail(status); });
}

absl::StatusOr<at::Tensor> GlooCommunicator::AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                       CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckGatherArgs(local, sizes, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  const absl::Time deadline = absl::Now() + timeout_;
  const std::string what = absl::StrCat("AllGather[", AsAbsl(CallKindName(kind)), "]");
  if (all_gather_ == GlooAllGather::kNative) {
    absl::StatusOr<at::Tensor> out = NativeAllGather(source, sizes, what, deadline);
    if (!out.ok()) return Fail(out.status());
    return out;
  }
  at::Tensor out;
  std::vector<Message> messages = PlanAllGather(source, sizes, rank_, world_size_, &out);
  absl::Status status = Exchange(std::move(messages), what, deadline);
  if (!status.ok()) return Fail(status);
  return out;
}

absl::StatusOr<at::Tensor> GlooCommunicator::NativeAllGather(const at::Tensor& source, absl::Span<const int64_t> sizes,
                                                             const std::string& what, absl::Time deadline) {
  // Gloo gathers equal shapes: every rank pads its rows to the largest band.
  const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
  if (widest == 0) return EmptyGatherOutput(source, sizes);
  std::vector<int64_t> shape = source.sizes().vec();
  shape[0] = widest;
  at::Tensor padded = source;
  if (sizes[rank_] != widest) {
    padded = at::zeros(shape, source.options());
    if (sizes[rank_] > 0) padded.narrow(0, 0, sizes[rank_]).copy_(source);
  }
  shape[0] = widest * world_size_;
  at::Tensor all = at::empty(shape, source.options());
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = pg_->_allgather_base(all, padded);
  } catch (...) {
    return StatusFromException(std::current_exception(), what, deadline);
  }
  RETURN_IF_ERROR(WaitCollective(work, what, deadline));
  bool even = true;
  for (int64_t size : sizes) even = even && size == widest;
  if (even) return all;
  std::vector<at::Tensor> rows;
  for (int r = 0; r < world_size_; ++r) rows.push_back(all.narrow(0, r * widest, sizes[r]));
  return at::cat(rows, 0);
}

absl::StatusOr<at::Tensor> GlooCommunicator::GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                                          int root, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s = CheckGatherArgs(local, sizes, rank_, world_size_, device()); !s.ok()) {
    return Fail(s);
  }
  const at::Tensor source = local.contiguous();
  if (world_size_ == 1) return source;
  const absl::Time deadline = absl::Now() + timeout_;
  at::Tensor out;
  std::vector<Message> messages = PlanGatherToRoot(source, sizes, rank_, world_size_, root, &out);
  absl::Status status =
      Exchange(std::move(messages), absl::StrCat("GatherToRoot[", AsAbsl(CallKindName(kind)), "]"), deadline);
  if (!status.ok()) return Fail(status);
  return out;
}

absl::Status GlooCommunicator::Broadcast(const at::Tensor& tensor, int root, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckRoot(root, world_size_); !s.ok()) return Fail(s);
  if (absl::Status s = CheckTensor(tensor, device(), "Broadcast"); !s.ok()) {
    return Fail(s);
  }
  if (world_size_ == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  // Point-to-point from the root: dtype-agnostic (bytes), bounded and
  // abortable like every other exchange.
  std::vector<Message> messages;
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  if (rank_ == root) {
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_) messages.push_back(Message{true, peer, buffer});
    }
  } else {
    messages.push_back(Message{false, root, buffer});
  }
  absl::Status status =
      Exchange(std::move(messages), absl::StrCat("Broadcast[", AsAbsl(CallKindName(kind)), "]"), deadline);
  if (!status.ok()) return Fail(status);
  if (rank_ != root && !buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduceSum(const at::Tensor& tensor, CallKind kind) {
  RETURN_IF_ERROR(CheckNotAborted());
  if (absl::Status s = CheckTensor(tensor, device(), "AllReduceSum"); !s.ok()) {
    return Fail(s);
  }
  const at::ScalarType type = tensor.scalar_type();
  if (!GlooReducesNatively(type) && type != at::kBFloat16) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("AllReduceSum: dtype ", c10::toString(type), " not supported by Gloo")));
  }
  if (world_size_ == 1 || tensor.numel() == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  // bf16 is summed in fp32: the more accurate order, and the same on every
  // Gloo build.
  at::Tensor buffer = type == at::kBFloat16 ? tensor.to(at::kFloat).contiguous() : tensor.contiguous();
  const std::string what = absl::StrCat("AllReduceSum[", AsAbsl(CallKindName(kind)), "]");
  c10::intrusive_ptr<c10d::Work> work;
  try {
    std::vector<at::Tensor> tensors{buffer};
    c10d::AllreduceOptions reduce_options;
    reduce_options.reduceOp = c10d::ReduceOp::SUM;
    work = pg_->allreduce(tensors, reduce_options);
  } catch (...) {
    return Fail(StatusFromException(std::current_exception(), what, deadline));
  }
  if (absl::Status s = WaitCollective(work, what, deadline); !s.ok()) {
    return Fail(s);
  }
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Barrier() {
  RETURN_IF_ERROR(CheckNotAborted());
  if (world_size_ == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout_;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = pg_->barrier(c10d::BarrierOptions());
  } catch (...) {
    return Fail(StatusFromException(std::current_exception(), "Barrier", deadline));
  }
  if (absl::Status s = WaitCollective(work, "Barrier", deadline); !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::parallel
