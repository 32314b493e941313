#pragma once

// Helpers shared by the communicator backends: argument checks that every
// backend applies identically, row offsets of an uneven gather, and the
// translation of exceptions thrown by c10d / NCCL glue into absl::Status.
// Not part of the interface operators use.

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "parallel/communicator.h"

namespace vaedecode::parallel {

// Debian's Abseil has its own absl::string_view (not std::string_view), so
// std::string_view values cross into StrCat / Status through this.
inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Checks a SendRecv batch: defined tensors on `device`, peers in range and
// not `rank`, receive tensors contiguous.
absl::Status CheckP2POps(absl::Span<const P2POp> ops, int rank, int world_size, c10::Device device);

// Checks an uneven gather: sizes.size() == world_size, sizes >= 0, `local`
// defined, on `device`, at least 1-D with local.size(0) == sizes[rank].
absl::Status CheckGatherArgs(const at::Tensor& local, absl::Span<const int64_t> sizes, int rank, int world_size,
                             c10::Device device);

// Checks a defined tensor on `device` (AllReduceSum, Broadcast).
absl::Status CheckTensor(const at::Tensor& tensor, c10::Device device, std::string_view what);

absl::Status CheckRoot(int root, int world_size);

// offsets[r] = sizes[0] + ... + sizes[r-1]; offsets has world_size + 1 entries.
std::vector<int64_t> RowOffsets(absl::Span<const int64_t> sizes);

// One point-to-point message of a backend's exchange.
struct PointToPoint {
  bool send;
  int peer;
  at::Tensor tensor;  // contiguous, on the communicator's device
};

// A SendRecv batch as the backend's messages (sends made contiguous).
std::vector<PointToPoint> PointToPointOf(absl::Span<const P2POp> ops);

// A backend's started SendRecv batch: Wait() runs `finish` (waits for the
// posted messages) once and hands an error to `fail` (aborts the group and
// returns its argument). Destroyed unwaited, it aborts the group first (so
// the finish that follows returns at once) and then finishes.
class StartedExchange final : public PendingSendRecv {
 public:
  StartedExchange(std::string what, std::function<absl::Status()> finish,
                  std::function<absl::Status(absl::Status)> fail);
  ~StartedExchange() override;
  absl::Status Wait() override;

 private:
  const std::string what_;
  const std::function<absl::Status()> finish_;
  const std::function<absl::Status(absl::Status)> fail_;
  bool waited_ = false;
};

// An uneven all-gather as point-to-point messages, shared by the backends:
// allocates *out (every rank's rows, this rank's already copied in) and
// returns the sends of `source` and the receives into *out's rows.
std::vector<PointToPoint> PlanAllGather(const at::Tensor& source, absl::Span<const int64_t> sizes, int rank,
                                        int world_size, at::Tensor* out);

// The same gathered to `root` only: on root *out as above and a receive per
// peer; elsewhere one send and *out left undefined.
std::vector<PointToPoint> PlanGatherToRoot(const at::Tensor& source, absl::Span<const int64_t> sizes, int rank,
                                           int world_size, int root, at::Tensor* out);

// The gather result: [sum(sizes), local.sizes()[1:]...], local's dtype and
// device, uninitialised.
at::Tensor EmptyGatherOutput(const at::Tensor& local, absl::Span<const int64_t> sizes);

// Bytes of one dim-0 row of `local` (product of the other dims * itemsize).
int64_t RowBytes(const at::Tensor& local);

// Maps an exception caught at the backend boundary to a Status: a message
// without C++ backtrace (c10::Error::what_without_backtrace), prefixed with
// `what`. DEADLINE_EXCEEDED if `deadline` has passed (the peer was too slow),
// else UNAVAILABLE (peer failure, closed connection, transport error).
absl::Status StatusFromException(std::exception_ptr error, std::string_view what, absl::Time deadline);

// max(1 ms, deadline - now): c10d treats a zero timeout as "no timeout".
std::chrono::milliseconds RemainingMillis(absl::Time deadline);

}  // namespace vaedecode::parallel
