#pragma once

// Carries an abort from the rank that failed to the ranks still blocked in a
// call with it. While at least one call is in flight on this rank, a
// background thread polls the group's abort key; when it appears, the
// callback runs once (on that thread) and the backend fails its pending
// calls. Idle ranks cost nothing: they find out when their next call starts
// waiting.

#include <functional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "parallel/store.h"

namespace vaedecode::parallel {

class AbortWatcher {
 public:
  // `group` must outlive this object. `on_abort` gets the published message.
  AbortWatcher(GroupStore* group, absl::Duration interval, std::function<void(const std::string&)> on_abort);
  // Stops and joins the thread; after it returns `on_abort` is never called.
  ~AbortWatcher();

  AbortWatcher(const AbortWatcher&) = delete;
  AbortWatcher& operator=(const AbortWatcher&) = delete;

  // Bracket every call that may block on peers. Thread-safe.
  void CallStarted();
  void CallFinished();

 private:
  void Run();

  GroupStore* const group_;
  const absl::Duration interval_;
  const std::function<void(const std::string&)> on_abort_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after every other member exists
};

// How a backend (Gloo, NCCL) turns a failed call into the group's abort,
// the one protocol both follow: a transport error ("connection closed") is
// often only the echo of a peer's failure, so when a peer published why the
// group aborted, this rank aborts quietly with that reason and reports it
// (UNAVAILABLE, "... (here: <this rank's error>)"); otherwise it aborts with
// its own error and publishes it for the others. INVALID_ARGUMENT (a bad
// call, not a broken group) never reads the store.
struct GroupFailure {
  absl::Status status;       // what the failed call returns
  std::string abort_reason;  // what this rank aborts with
  bool publish = true;       // whether to publish abort_reason to the peers
};
GroupFailure ExplainGroupFailure(GroupStore* group, std::string_view group_name, absl::Status status);

}  // namespace vaedecode::parallel
