#pragma once

// The open streaming sessions (DecodeSession) and the limits on them. A
// session is pinned at open to one group that loaded its model (its causal
// state lives in that group's workers, so every chunk runs there): the one
// with the fewest sessions, among those with room for one more session and
// for its state within the per-rank state budget.
//
// Thread-safe; Open and Close only take the registry's lock (and the
// catalog's), so gRPC's callback threads call them.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/model_catalog.h"
#include "server/session_record.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

struct SessionLimits {
  int max_sessions_per_group = 8;
  // What the open sessions' states may hold on each rank of a group; a
  // session whose expected state would pass it is refused at open.
  int64_t state_budget_bytes_per_rank = int64_t{4} << 30;
  // A session waiting this long for its client's next message is ended; a
  // client may ask for less.
  absl::Duration idle_timeout = absl::Seconds(60);
  // A session's latent history kept for replays (server/session_record.h).
  int64_t max_history_bytes = int64_t{256} << 20;
};

class SessionRegistry {
 public:
  // A group's tightest rank's capacity (what a decode may use with nothing
  // else on its device); -1: unbounded or unknown.
  using GroupCapacity = std::function<int64_t(const std::string& group)>;

  SessionRegistry(SessionLimits limits, ModelCatalog& catalog) : limits_(limits), catalog_(catalog) {}

  // Set once, before the first Open (the server's groups).
  void SetGroupCapacity(GroupCapacity capacity) { capacity_ = std::move(capacity); }

  // Opens a session of `model` in `mode` whose state is expected to hold
  // `state_bytes_per_rank` on each rank that holds it, and whose one-frame
  // chunk is estimated to peak at `chunk_peak_bytes` per rank: a group has
  // room when its open sessions' states, this one and a chunk's peak fit the
  // capacity it reported (and the states the budget). RESOURCE_EXHAUSTED
  // (saying which limit) when no group has room, UNAVAILABLE when no group
  // loaded the model.
  absl::StatusOr<std::shared_ptr<SessionRecord>> Open(const std::string& public_id, const std::string& model,
                                                      v1::Mode mode, int64_t state_bytes_per_rank,
                                                      int64_t chunk_peak_bytes = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // A chunk of `session` left `state_bytes_per_rank` held on its most loaded
  // rank: counted from now on; RESOURCE_EXHAUSTED (naming the limit) when
  // its group's states have outgrown the budget or the group's capacity.
  absl::Status Grow(SessionRecord& session, int64_t state_bytes_per_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The session ended: its room is free again.
  void Close(const SessionRecord& session) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t open() const ABSL_LOCKS_EXCLUDED(mu_);
  const SessionLimits& limits() const { return limits_; }

 private:
  struct GroupLoad {
    int sessions = 0;
    int64_t state_bytes_per_rank = 0;
  };
  const SessionLimits limits_;
  ModelCatalog& catalog_;
  GroupCapacity capacity_;
  mutable absl::Mutex mu_;
  std::map<std::string, GroupLoad> load_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace vaedecode::server
