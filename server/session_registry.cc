#include "server/session_registry.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace vaedecode::server {

absl::StatusOr<std::shared_ptr<SessionRecord>> SessionRegistry::Open(const std::string& public_id,
                                                                     const std::string& model, v1::Mode mode,
                                                                     int64_t state_bytes_per_rank,
                                                                     int64_t chunk_peak_bytes) {
  const std::vector<std::string> groups = catalog_.GroupsLoading(model);
  if (groups.empty()) {
    return absl::UnavailableError(absl::StrCat("no worker group has model \"", model, "\" loaded"));
  }
  if (state_bytes_per_rank > limits_.state_budget_bytes_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session's decoder state would hold ", state_bytes_per_rank, " bytes per rank, more than the ",
        limits_.state_budget_bytes_per_rank, " the server's --session_state_budget_mib allows; send smaller frames"));
  }
  // Capacities first: they come from the groups, not under this lock.
  std::vector<int64_t> capacities;
  for (const std::string& group : groups) capacities.push_back(capacity_ ? capacity_(group) : -1);
  absl::MutexLock lock(&mu_);
  const std::string* best = nullptr;
  // Why the groups without room had none (the refusal names the first).
  bool full_of_sessions = false, over_budget = false;
  int64_t roomiest = -1;  // the most bytes a rank had for this session's state and chunk
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupLoad& load = load_[groups[i]];
    const int64_t states = load.state_bytes_per_rank + state_bytes_per_rank;
    if (load.sessions >= limits_.max_sessions_per_group) {
      full_of_sessions = true;
    } else if (states > limits_.state_budget_bytes_per_rank) {
      over_budget = true;
    } else if (capacities[i] >= 0 && states + chunk_peak_bytes > capacities[i]) {
      roomiest = std::max(roomiest, capacities[i] - load.state_bytes_per_rank);
    } else if (best == nullptr || load.sessions < load_[*best].sessions) {
      best = &groups[i];
    }
  }
  if (best == nullptr) {
    if (full_of_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat("every worker group serving \"", model, "\" has ",
                                                       limits_.max_sessions_per_group,
                                                       " sessions open (--max_sessions_per_group) or no room; retry "
                                                       "when one closes"));
    }
    if (over_budget) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the open sessions' decoder states leave no group room for another ", state_bytes_per_rank,
                       " bytes per rank (--session_state_budget_mib); retry later"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "no worker group serving \"", model, "\" has the memory: the session's decoder state (", state_bytes_per_rank,
        " bytes per rank) and a chunk's decode (", chunk_peak_bytes, " bytes) need more than the ",
        std::max<int64_t>(roomiest, 0),
        " bytes the roomiest rank has beside its open sessions; send smaller frames or retry when a session "
        "closes"));
  }
  GroupLoad& load = load_[*best];
  ++load.sessions;
  load.state_bytes_per_rank += state_bytes_per_rank;
  ++open_;
  return std::make_shared<SessionRecord>(next_id_++, public_id, *best, mode, state_bytes_per_rank,
                                         limits_.max_history_bytes);
}

absl::Status SessionRegistry::Grow(SessionRecord& session, int64_t state_bytes_per_rank) {
  const int64_t capacity = capacity_ ? capacity_(session.group()) : -1;
  absl::MutexLock lock(&mu_);
  GroupLoad& load = load_[session.group()];
  load.state_bytes_per_rank += state_bytes_per_rank - session.state_bytes_per_rank();
  session.set_state_bytes_per_rank(state_bytes_per_rank);
  if (load.state_bytes_per_rank > limits_.state_budget_bytes_per_rank) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the sessions' decoder states on group ", session.group(), " grew to ", load.state_bytes_per_rank,
                     " bytes per rank, past --session_state_budget_mib (", limits_.state_budget_bytes_per_rank,
                     "); this session (", state_bytes_per_rank, " bytes per rank) ends after its last chunk"));
  }
  if (capacity >= 0 && load.state_bytes_per_rank > capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the sessions' decoder states on group ", session.group(), " grew to ", load.state_bytes_per_rank,
        " bytes per rank, past the ", capacity, " its ranks hold; this session ends after its last chunk"));
  }
  return absl::OkStatus();
}

void SessionRegistry::Close(const SessionRecord& session) {
  absl::MutexLock lock(&mu_);
  GroupLoad& load = load_[session.group()];
  --load.sessions;
  load.state_bytes_per_rank -= session.state_bytes_per_rank();
  --open_;
}

int64_t SessionRegistry::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

}  // namespace vaedecode::server
