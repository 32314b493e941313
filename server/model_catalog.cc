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
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (entry.is_directory(ec)) names.push_back(name);
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

void ModelCatalog::GroupReady(const std::string& group, const std::vector<v1::ModelInfo>& models) {
  {
    absl::MutexLock lock(&mu_);
    if (!names_from_leader_) {
      names_.clear();
      names_from_leader_ = true;
    }
    for (const v1::ModelInfo& m : models) {
      names_.insert(m.name());
      info_[m.name()] = m;
    }
    for (auto& [name, groups] : ready_groups_) groups.erase(group);
    for (const v1::ModelInfo& m : models) ready_groups_[m.name()].insert(group);
  }
  Notify();
}

void ModelCatalog::GroupDown(const std::string& group) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, groups] : ready_groups_) groups.erase(group);
  }
  Notify();
}

absl::StatusOr<v1::ModelInfo> ModelCatalog::Lookup(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (names_.count(name) == 0) {
    return absl::NotFoundError(
        absl::StrCat("model \"", name, "\" not found; available: ", absl::StrJoin(names_, ", ")));
  }
  auto it = info_.find(name);
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

bool ModelCatalog::Serving(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (names_.count(name) == 0) return false;
  auto it = ready_groups_.find(name);
  return it != ready_groups_.end() && !it->second.empty();
}

bool ModelCatalog::GroupServes(const std::string& group, const std::string& model) const {
  absl::MutexLock lock(&mu_);
  auto it = ready_groups_.find(model);
  return it != ready_groups_.end() && it->second.count(group) > 0;
}

}  // namespace vaedecode::server
