#include "server/session_registry.h"

#include "absl/strings/str_cat.h"

namespace vaedecode::server {

absl::StatusOr<std::shared_ptr<SessionRecord>> SessionRegistry::Open(const std::string& public_id,
                                                                     const std::string& model, v1::Mode mode,
                                                                     int64_t state_bytes_per_rank) {
  const std::vector<std::string> groups = catalog_.GroupsLoading(model);
  if (groups.empty()) {
    return absl::UnavailableError(absl::StrCat("no worker group has model \"", model, "\" loaded"));
  }
  if (state_bytes_per_rank > limits_.state_budget_bytes_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the session's decoder state would hold ", state_bytes_per_rank, " bytes per rank, more than the ",
        limits_.state_budget_bytes_per_rank, " the server's --session_state_budget_mib allows; send smaller frames"));
  }
  absl::MutexLock lock(&mu_);
  const std::string* best = nullptr;
  bool full_of_sessions = false;
  for (const std::string& group : groups) {
    const GroupLoad& load = load_[group];
    if (load.sessions >= limits_.max_sessions_per_group) {
      full_of_sessions = true;
      continue;
    }
    if (load.state_bytes_per_rank + state_bytes_per_rank > limits_.state_budget_bytes_per_rank) continue;
    if (best == nullptr || load.sessions < load_[*best].sessions) best = &group;
  }
  if (best == nullptr) {
    return absl::ResourceExhaustedError(
        full_of_sessions
            ? absl::StrCat("every worker group serving \"", model, "\" has ", limits_.max_sessions_per_group,
                           " sessions open (--max_sessions_per_group); retry when one closes")
            : absl::StrCat("the open sessions' decoder states leave no group room for another ", state_bytes_per_rank,
                           " bytes per rank (--session_state_budget_mib); retry later"));
  }
  GroupLoad& load = load_[*best];
  ++load.sessions;
  load.state_bytes_per_rank += state_bytes_per_rank;
  ++open_;
  return std::make_shared<SessionRecord>(next_id_++, public_id, *best, mode, state_bytes_per_rank,
                                         limits_.max_history_bytes);
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
