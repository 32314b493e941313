#include "parallel/comm_util.h"

#include <algorithm>
#include <chrono>
#include <string>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel {

absl::Status CheckTensor(const at::Tensor& tensor, c10::Device device, std::string_view what) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), ": undefined tensor"));
  }
  if (tensor.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), ": tensor on ", tensor.device().str(), ", communicator on ", device.str()));
  }
  return absl::OkStatus();
}

absl::Status CheckP2POps(absl::Span<const P2POp> ops, int rank, int world_size, c10::Device device) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const std::string what = absl::StrCat("SendRecv op ", i, op.kind == P2POp::kSend ? " (send)" : " (recv)");
    if (op.peer < 0 || op.peer >= world_size || op.peer == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": peer ", op.peer, " invalid for rank ", rank, " of ", world_size));
    }
    RETURN_IF_ERROR(CheckTensor(op.tensor, device, what));
    if (op.kind == P2POp::kRecv && !op.tensor.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), ": receive tensor must be contiguous"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGatherArgs(const at::Tensor& local, absl::Span<const int64_t> sizes, int rank, int world_size,
                             c10::Device device) {
  if (static_cast<int>(sizes.size()) != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("gather: ", sizes.size(), " sizes for world size ", world_size));
  }
  for (int64_t size : sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError("gather: negative size");
    }
  }
  RETURN_IF_ERROR(CheckTensor(local, device, "gather"));
  if (local.dim() < 1) {
    return absl::InvalidArgumentError("gather: local tensor must be at least 1-D");
  }
  if (local.size(0) != sizes[rank]) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather: rank ", rank, " has ", local.size(0), " rows, the partition says ", sizes[rank]));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int world_size) {
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("root ", root, " out of range for world size ", world_size));
  }
  return absl::OkStatus();
}

std::vector<int64_t> RowOffsets(absl::Span<const int64_t> sizes) {
  std::vector<int64_t> offsets(sizes.size() + 1, 0);
  for (size_t r = 0; r < sizes.size(); ++r) offsets[r + 1] = offsets[r] + sizes[r];
  return offsets;
}

at::Tensor EmptyGatherOutput(const at::Tensor& local, absl::Span<const int64_t> sizes) {
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] = RowOffsets(sizes).back();
  return at::empty(shape, local.options());
}

int64_t RowBytes(const at::Tensor& local) {
  int64_t elements = 1;
  for (int64_t d = 1; d < local.dim(); ++d) elements *= local.size(d);
  return elements * static_cast<int64_t>(local.element_size());
}

absl::Status StatusFromException(std::exception_ptr error, std::string_view what, absl::Time deadline) {
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  // Keep status messages one line and bounded; c10d messages can be long.
  std::replace(message.begin(), message.end(), '\n', ' ');
  constexpr size_t kMaxMessage = 1000;
  if (message.size() > kMaxMessage) message.resize(kMaxMessage);
  // Transport timeouts are set to the time left before `deadline`, so they
  // fire a hair before it.
  if (absl::Now() + absl::Milliseconds(20) >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(AsAbsl(what), ": ", message));
  }
  return absl::UnavailableError(absl::StrCat(AsAbsl(what), ": ", message));
}

std::chrono::milliseconds RemainingMillis(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return std::chrono::milliseconds(std::max<int64_t>(1, ms));
}

std::vector<PointToPoint> PointToPointOf(absl::Span<const P2POp> ops) {
  std::vector<PointToPoint> messages;
  messages.reserve(ops.size());
  for (const P2POp& op : ops) {
    const bool send = op.kind == P2POp::kSend;
    messages.push_back(PointToPoint{send, op.peer, send ? op.tensor.contiguous() : op.tensor});
  }
  return messages;
}

StartedExchange::StartedExchange(std::string what, std::function<absl::Status()> finish,
                                 std::function<absl::Status(absl::Status)> fail)
    : what_(std::move(what)), finish_(std::move(finish)), fail_(std::move(fail)) {}

StartedExchange::~StartedExchange() {
  if (waited_) return;
  (void)fail_(absl::InternalError(absl::StrCat(AsAbsl(what_), ": abandoned before its wait")));
  (void)finish_();
}

absl::Status StartedExchange::Wait() {
  if (waited_) return absl::FailedPreconditionError(absl::StrCat(AsAbsl(what_), ": waited on twice"));
  waited_ = true;
  absl::Status status = finish_();
  return status.ok() ? status : fail_(status);
}

std::vector<PointToPoint> PlanAllGather(const at::Tensor& source, absl::Span<const int64_t> sizes, int rank,
                                        int world_size, at::Tensor* out) {
  const std::vector<int64_t> offsets = RowOffsets(sizes);
  *out = EmptyGatherOutput(source, sizes);
  if (sizes[rank] > 0) out->narrow(0, offsets[rank], sizes[rank]).copy_(source);
  std::vector<PointToPoint> messages;
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    messages.push_back(PointToPoint{false, peer, out->narrow(0, offsets[peer], sizes[peer])});
    messages.push_back(PointToPoint{true, peer, source});
  }
  return messages;
}

std::vector<PointToPoint> PlanGatherToRoot(const at::Tensor& source, absl::Span<const int64_t> sizes, int rank,
                                           int world_size, int root, at::Tensor* out) {
  if (rank != root) return {PointToPoint{true, root, source}};
  const std::vector<int64_t> offsets = RowOffsets(sizes);
  *out = EmptyGatherOutput(source, sizes);
  if (sizes[rank] > 0) out->narrow(0, offsets[rank], sizes[rank]).copy_(source);
  std::vector<PointToPoint> messages;
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    messages.push_back(PointToPoint{false, peer, out->narrow(0, offsets[peer], sizes[peer])});
  }
  return messages;
}

}  // namespace vaedecode::parallel
