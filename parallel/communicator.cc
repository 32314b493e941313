#include "parallel/communicator.h"

#include <string>
#include <utility>

namespace vaedecode::parallel {

std::string_view CallKindName(CallKind kind) {
  switch (kind) {
    case CallKind::kHalo:
      return "halo";
    case CallKind::kGroupNormStats:
      return "group_norm_stats";
    case CallKind::kAttentionKV:
      return "attention_kv";
    case CallKind::kGatherOutput:
      return "gather_output";
    case CallKind::kBroadcastJob:
      return "broadcast_job";
    case CallKind::kOther:
      return "other";
  }
  return "unknown";
}

namespace {

// A batch that already ran: Wait() returns its status.
class CompletedSendRecv final : public PendingSendRecv {
 public:
  explicit CompletedSendRecv(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

std::unique_ptr<PendingSendRecv> Communicator::StartSendRecv(absl::Span<const P2POp> ops, CallKind kind) {
  return std::make_unique<CompletedSendRecv>(SendRecv(ops, kind));
}

absl::Status AbortWith(Communicator& comm, absl::Status status) {
  comm.Abort(std::string(status.message()));
  return status;
}

}  // namespace vaedecode::parallel
