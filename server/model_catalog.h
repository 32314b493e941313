#pragma once

// Which models the server offers and which worker groups can serve each one
// right now. Model descriptions (ModelInfo) come from the group leaders'
// GroupLeader.Models answers; before any group has answered, the names come
// from the model repository's folder listing, so health can already report
// them (NOT_SERVING) and requests for them get UNAVAILABLE rather than
// NOT_FOUND. Once a leader has answered, its list is the authority on names.
//
// Thread-safe: every method may be called from any thread. The listener runs
// outside the catalog's lock on the thread that made the change.

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// The model names a --model_repository holds: its subfolders (hidden ones
// skipped), sorted; {"default"} (the workers' embedded model) for "".
// INVALID_ARGUMENT when the folder is missing or has no subfolder.
absl::StatusOr<std::vector<std::string>> ListRepositoryModels(const std::string& dir);

class ModelCatalog {
 public:
  explicit ModelCatalog(std::vector<std::string> expected_names);

  // Called after every change of which models are served. Set before groups
  // start.
  void SetListener(std::function<void()> listener);

  // `group` finished (re)building and serves `models`; `unavailable` are the
  // repository's models its workers could not load, with why. Returns those
  // of `unavailable` whose reason is news (for the log).
  std::vector<v1::UnavailableModel> GroupReady(const std::string& group, const std::vector<v1::ModelInfo>& models,
                                               const std::vector<v1::UnavailableModel>& unavailable = {});
  // `group` broke or stopped.
  void GroupDown(const std::string& group);
  // `group` is (or is no longer) out of rotation while ready: its leader is
  // still finishing a cancelled request. Serving() leaves it out; a
  // GroupReady or GroupDown ends the pause.
  void GroupPaused(const std::string& group, bool paused);
  // The model repository itself is gone (a group could not start for it):
  // every model not loaded by a ready group fails with `reason` until a group
  // loads it again. Returns whether that is news (for the log).
  bool RepositoryMissing(const std::string& reason);

  // The model's description. NOT_FOUND (listing the known names) for an
  // unknown name; UNAVAILABLE for a known name no group has loaded yet, or
  // one that failed to load (naming why).
  absl::StatusOr<v1::ModelInfo> Lookup(const std::string& name) const;

  // Every known model with a description, sorted by name.
  std::vector<v1::ModelInfo> List() const;
  // Every known name (with or without a description), sorted.
  std::vector<std::string> Names() const;
  // The models that failed to load and no group serves, by name, with why.
  std::vector<v1::UnavailableModel> Unavailable() const;
  // True when some ready group serves `name`.
  bool Serving(const std::string& name) const;
  bool GroupServes(const std::string& group, const std::string& model) const;
  // The groups whose latest incarnation loaded `model` (ready now, or being
  // rebuilt), sorted: where a streaming session may be pinned.
  std::vector<std::string> GroupsLoading(const std::string& model) const;

 private:
  void Notify();

  mutable absl::Mutex mu_;
  std::set<std::string> names_ ABSL_GUARDED_BY(mu_);
  bool names_from_leader_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, v1::ModelInfo> info_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> load_failures_ ABSL_GUARDED_BY(mu_);  // name -> why
  // What each group's latest incarnation loaded (kept while it is down).
  std::map<std::string, std::set<std::string>> group_models_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> ready_groups_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> paused_groups_ ABSL_GUARDED_BY(mu_);
  std::function<void()> listener_;  // set before concurrent use
};

}  // namespace vaedecode::server
