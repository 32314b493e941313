#pragma once

// The one interface every sharding operator talks to. Backends: Gloo over
// c10d (CPU; tests and CPU serving), NCCL (GPU; production), and the counting
// decorator. Operators never see a backend type.
//
// Contract shared by every implementation:
//  * Collective order. Every rank of the group makes the same sequence of
//    calls (SendRecv included, possibly with an empty batch).
//  * Completion. On a CPU (Gloo) a call returns once this rank's part of
//    the exchange is complete. On a GPU (NCCL) it returns once the exchange
//    is queued in stream order: work the caller queues afterwards on its
//    stream sees the results (reading them on the host syncs that stream);
//    its failure surfaces at a later call or at Synchronize(), which a
//    caller makes before trusting what it read on the host.
//  * Threading. rank(), world_size(), device() and Abort() may be called from
//    any thread at any time. All other calls come from one thread at a time.
//  * Bounded. Every call finishes within the communicator's timeout (set at
//    creation): DEADLINE_EXCEEDED when it expires, UNAVAILABLE when a peer
//    fails, disconnects or aborts. Nothing throws across the interface.
//  * Fail-stop. After any error (invalid arguments included: once one rank
//    skips an exchange the group's call sequences no longer match) the
//    communicator is aborted: the failure is published to the other ranks,
//    whose pending and future calls fail fast, and every later call on any
//    rank returns UNAVAILABLE. The group needs a new communicator
//    (worker/group_recovery.h forms one in place after an out-of-memory).
//  * World size 1. Collectives are trivial, touch no network and no peer.
//  * Tensors live on device(). Shapes that every rank can compute (band
//    sizes from the partition) are passed in, never communicated.

#include <cstdint>
#include <memory>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace vaedecode::parallel {

// Which kind of call site issues a call; only used for accounting.
enum class CallKind {
  kHalo,            // convolution halo rows between neighbours
  kGroupNormStats,  // GroupNorm (count, mean, M2) exchange
  kAttentionKV,     // K/V all-gather of sharded attention
  kGatherOutput,    // decoded rows to the leader
  kBroadcastJob,    // job description from the leader
  kOther,
};
inline constexpr int kNumCallKinds = 6;

// Stable snake_case name ("halo", "group_norm_stats", ...), for logs and
// metric labels.
std::string_view CallKindName(CallKind kind);

// One point-to-point message of a SendRecv batch.
struct P2POp {
  enum Kind { kSend, kRecv };
  Kind kind = kSend;
  int peer = -1;  // rank in [0, world_size), never this rank
  // kSend: any layout (sent as its contiguous bytes). kRecv: preallocated,
  // contiguous, exactly the size the peer sends; written in place.
  at::Tensor tensor;
};

// A SendRecv batch posted by Communicator::StartSendRecv, not yet waited on.
class PendingSendRecv {
 public:
  // Destroyed without a successful Wait() (e.g. the compute in between
  // threw), the batch is abandoned: the communicator is aborted, since its
  // peers can no longer be kept in step.
  virtual ~PendingSendRecv() = default;
  // Returns once every message of the batch is complete (receive tensors
  // hold their data, send tensors may be reused), with SendRecv's errors;
  // the timeout counts from the start. Call once.
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual c10::Device device() const = 0;

  // All sends and receives of one exchange, issued together (an NCCL group;
  // on Gloo all posted, then all waited) so that both directions of a halo
  // exchange overlap and no ordering between them can deadlock. Between a
  // pair of ranks, the i-th send from A to B in the batch order matches the
  // i-th receive from A posted by B. Zero-element messages are skipped on
  // both sides.
  virtual absl::Status SendRecv(absl::Span<const P2POp> ops, CallKind kind) = 0;

  // SendRecv split in two, so that a rank computes while its messages are
  // in flight: posts the batch and returns; the caller may then compute on
  // other tensors, but must not read a receive tensor, write a send tensor
  // or make any other call on this communicator before the pending's
  // Wait() returns. It is the same call as SendRecv for ordering and
  // counting. This default runs SendRecv at once (no overlap); backends
  // whose transfers progress on their own (Gloo's transport threads)
  // override it.
  virtual std::unique_ptr<PendingSendRecv> StartSendRecv(absl::Span<const P2POp> ops, CallKind kind);

  // Uneven all-gather along dim 0. Rank r contributes `local` with
  // local.size(0) == sizes[r] (sizes come from the partition and are never
  // communicated; sizes.size() == world_size); the other dims and the dtype
  // match on every rank. Returns the concatenation in rank order, contiguous,
  // with sum(sizes) rows and no transport padding. At world size 1 the result
  // may share storage with `local`.
  virtual absl::StatusOr<at::Tensor> AllGather(const at::Tensor& local, absl::Span<const int64_t> sizes,
                                               CallKind kind) = 0;

  // Element-wise sum over ranks, written into `tensor`'s storage in place.
  virtual absl::Status AllReduceSum(const at::Tensor& tensor, CallKind kind) = 0;

  // Copies `root`'s tensor into every rank's `tensor` in place; shape and
  // dtype are known to all ranks beforehand.
  virtual absl::Status Broadcast(const at::Tensor& tensor, int root, CallKind kind) = 0;

  // Like AllGather, but only `root` receives the concatenation; other ranks
  // get an undefined tensor. At world size 1 the result may share storage
  // with `local`.
  virtual absl::StatusOr<at::Tensor> GatherToRoot(const at::Tensor& local, absl::Span<const int64_t> sizes, int root,
                                                  CallKind kind) = 0;

  virtual absl::Status Barrier() = 0;

  // Waits until every call made so far is complete on the device; the
  // first failure among them, or OK. Within the timeout. Backends whose
  // calls complete before returning have nothing to wait for.
  virtual absl::Status Synchronize() { return absl::OkStatus(); }

  // Milliseconds this rank's calls spent on the device since the last call
  // to this, between events around each call's transfers (moving data and
  // waiting for peers, not the compute queued before them), for backends
  // whose calls do not block the host (NCCL); -1 for backends whose calls
  // block it, whose time the caller's clock measures (CountingCommunicator).
  virtual double TakeDeviceCallMs() { return -1; }

  // Makes every pending and future call on every rank fail fast with
  // UNAVAILABLE carrying `reason` (used when one rank fails). Idempotent;
  // callable from any thread.
  virtual void Abort(std::string_view reason) = 0;
};

// Aborts `comm` with `status`'s message (so peers blocked in a call return
// at once) and returns `status`: for an error that leaves the ranks out of
// step.
absl::Status AbortWith(Communicator& comm, absl::Status status);

}  // namespace vaedecode::parallel
