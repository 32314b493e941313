#include "server/model_catalog.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::server {

absl::StatusOr<std::vector<std::string>> ListRepositoryModels(const std::string& dir) {
  if (dir.empty()) return std::vector<std::string>{"default"};
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("--model_repository=", dir, ": not a directory"));
  }
  std::vector<std::string> names;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    // An entry that cannot be read (a symlink loop, a dangling link) is a
    // model the workers report unavailable, with the reason.
    std::error_code entry_ec;
    if (it->is_directory(entry_ec) || entry_ec) names.push_back(name);
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--model_repository=", dir, ": ", ec.message()));
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_repository=", dir, ": no model folders (each subfolder is one diffusers VAE)"));
  }
  std::sort(names.begin(), names.end());
  return names;
}

ModelCatalog::ModelCatalog(std::vector<std::string> expected_names)
    : names_(expected_names.begin(), expected_names.end()) {}

void ModelCatalog::SetListener(std::function<void()> listener) { listener_ = std::move(listener); }

void ModelCatalog::Notify() {
  if (listener_) listener_();
}

std::vector<v1::UnavailableModel> ModelCatalog::GroupReady(const std::string& group,
                                                           const std::vector<v1::ModelInfo>& models,
                                                           const std::vector<v1::UnavailableModel>& unavailable) {
  std::vector<v1::UnavailableModel> news;
  {
    absl::MutexLock lock(&mu_);
    if (!names_from_leader_) {
      names_.clear();
      names_from_leader_ = true;
    }
    std::set<std::string> reported;
    for (const v1::ModelInfo& m : models) {
      names_.insert(m.name());
      info_[m.name()] = m;
      load_failures_.erase(m.name());
      reported.insert(m.name());
    }
    for (const v1::UnavailableModel& m : unavailable) reported.insert(m.name());
    // A model this group served that its new incarnation does not know: the
    // folder left the repository. Unless another group still serves it, its
    // requests fail now instead of waiting for a group that will never come.
    const auto loaded_elsewhere = [&](const std::string& name) {
      for (const auto& [other, served] : group_models_) {
        if (other != group && served.count(name) > 0) return true;
      }
      return false;
    };
    std::vector<v1::UnavailableModel> removed;
    for (const std::string& name : group_models_[group]) {
      if (reported.count(name) > 0 || loaded_elsewhere(name)) continue;
      v1::UnavailableModel& gone = removed.emplace_back();
      gone.set_name(name);
      gone.set_reason("its folder is no longer in the model repository");
    }
    std::set<std::string>& served = group_models_[group];
    served.clear();
    for (const v1::ModelInfo& m : models) served.insert(m.name());
    const auto record_failure = [&](const v1::UnavailableModel& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      names_.insert(m.name());
      if (loaded_elsewhere(m.name())) return;
      info_.erase(m.name());  // a description of what no longer loads
      auto [it, inserted] = load_failures_.try_emplace(m.name(), m.reason());
      if (inserted || it->second != m.reason()) news.push_back(m);
      it->second = m.reason();
    };
    for (const v1::UnavailableModel& m : unavailable) record_failure(m);
    for (const v1::UnavailableModel& m : removed) record_failure(m);
    for (auto& [name, groups] : ready_groups_) groups.erase(group);
    for (const v1::ModelInfo& m : models) ready_groups_[m.name()].insert(group);
    paused_groups_.erase(group);
  }
  Notify();
  return news;
}

void ModelCatalog::GroupDown(const std::string& group) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, groups] : ready_groups_) groups.erase(group);
    paused_groups_.erase(group);
  }
  Notify();
}

void ModelCatalog::GroupPaused(const std::string& group, bool paused) {
  {
    absl::MutexLock lock(&mu_);
    if (paused) {
      paused_groups_.insert(group);
    } else {
      paused_groups_.erase(group);
    }
  }
  Notify();
}

bool ModelCatalog::RepositoryMissing(const std::string& reason) {
  bool news = false;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& name : names_) {
      auto ready = ready_groups_.find(name);
      if (ready != ready_groups_.end() && !ready->second.empty()) continue;
      auto [it, inserted] = load_failures_.try_emplace(name, reason);
      news |= inserted || it->second != reason;
      it->second = reason;
      info_.erase(name);
    }
  }
  if (news) Notify();
  return news;
}

absl::StatusOr<v1::ModelInfo> ModelCatalog::Lookup(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (names_.count(name) == 0) {
    return absl::NotFoundError(
        absl::StrCat("model \"", name, "\" not found; available: ", absl::StrJoin(names_, ", ")));
  }
  auto it = info_.find(name);
  if (auto failed = load_failures_.find(name); failed != load_failures_.end()) {
    return absl::UnavailableError(absl::StrCat("model \"", name, "\" failed to load: ", failed->second));
  }
  if (it == info_.end()) {
    return absl::UnavailableError(
        absl::StrCat("model \"", name, "\" is still loading: no worker group has started yet"));
  }
  return it->second;
}

std::vector<v1::ModelInfo> ModelCatalog::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ModelInfo> out;
  for (const std::string& name : names_) {
    auto it = info_.find(name);
    if (it != info_.end()) out.push_back(it->second);
  }
  return out;
}

std::vector<std::string> ModelCatalog::Names() const {
  absl::MutexLock lock(&mu_);
  return {names_.begin(), names_.end()};
}

std::vector<v1::UnavailableModel> ModelCatalog::Unavailable() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::UnavailableModel> out;
  for (const auto& [name, reason] : load_failures_) {
    v1::UnavailableModel& m = out.emplace_back();
    m.set_name(name);
    m.set_reason(reason);
  }
  return out;
}

bool ModelCatalog::Serving(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (names_.count(name) == 0) return false;
  auto it = ready_groups_.find(name);
  if (it == ready_groups_.end()) return false;
  for (const std::string& group : it->second) {
    if (paused_groups_.count(group) == 0) return true;
  }
  return false;
}

bool ModelCatalog::GroupServes(const std::string& group, const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = ready_groups_.find(model);
  return it != ready_groups_.end() && it->second.count(group) > 0;
}

std::vector<std::string> ModelCatalog::GroupsLoading(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> groups;
  for (const auto& [group, served] : group_models_) {
    if (served.count(model) > 0) groups.push_back(group);
  }
  return groups;
}

}  // namespace vaedecode::server
