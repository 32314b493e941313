#include "parallel/abort_watcher.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vaedecode::parallel {

AbortWatcher::AbortWatcher(GroupStore* group, absl::Duration interval, std::function<void(const std::string&)> on_abort)
    : group_(group), interval_(interval), on_abort_(std::move(on_abort)), thread_([this] { Run(); }) {}

AbortWatcher::~AbortWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void AbortWatcher::CallStarted() {
  absl::MutexLock lock(&mu_);
  ++in_flight_;
  cv_.SignalAll();
}

void AbortWatcher::CallFinished() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void AbortWatcher::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // Sleep while idle; while busy, poll once per interval. The first poll
    // comes one interval after a call starts, so fast calls never reach the
    // store.
    if (in_flight_ == 0) {
      cv_.Wait(&mu_);
      continue;
    }
    cv_.WaitWithTimeout(&mu_, interval_);
    if (stop_ || in_flight_ == 0) continue;
    mu_.Unlock();
    absl::StatusOr<std::optional<std::string>> aborted = group_->CheckAbort();
    mu_.Lock();
    if (!aborted.ok()) {
      // The store's host is gone. That is not by itself a failure of this
      // call's peers (they may be alive); their transport errors or the call
      // deadline decide. Stop polling a dead store.
      return;
    }
    if (aborted->has_value() && !stop_) {
      mu_.Unlock();
      on_abort_(**aborted);
      mu_.Lock();
      return;  // the group is aborted for good
    }
  }
}

GroupFailure ExplainGroupFailure(GroupStore* group, std::string_view group_name, absl::Status status) {
  if (group != nullptr && status.code() != absl::StatusCode::kInvalidArgument) {
    absl::StatusOr<std::optional<std::string>> peer = group->CheckAbort();
    if (peer.ok() && peer->has_value()) {
      return {absl::UnavailableError(absl::StrCat("group '", std::string(group_name), "' aborted: ", **peer,
                                                  " (here: ", status.message(), ")")),
              **peer, /*publish=*/false};
    }
  }
  std::string reason = status.ToString();
  return {std::move(status), std::move(reason), /*publish=*/true};
}

}  // namespace vaedecode::parallel
