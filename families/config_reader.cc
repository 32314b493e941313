#include "families/config_reader.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::families {

ConfigReader::ConfigReader(const nlohmann::json& config, std::string source)
    : config_(config), source_(std::move(source)) {
  if (!config_.is_object()) errors_.push_back("config is not a JSON object");
}

const nlohmann::json* ConfigReader::Find(const char* key) const {
  looked_up_.insert(key);
  if (!config_.is_object()) return nullptr;
  auto it = config_.find(key);
  if (it == config_.end() || it->is_null()) return nullptr;
  return &*it;
}

void ConfigReader::TypeError(const char* key, const char* expected) {
  errors_.push_back(absl::StrCat("\"", key, "\" must be ", expected));
}

void ConfigReader::RequireSilu(const std::string& act_fn) {
  if (act_fn != "silu" && act_fn != "swish") {
    Fail(absl::StrCat("act_fn \"", act_fn, "\" is not supported (only silu, which diffusers also names swish)"));
  }
}

void ConfigReader::Fail(const std::string& message) { errors_.push_back(message); }

void ConfigReader::Known(std::initializer_list<const char*> keys) {
  for (const char* key : keys) looked_up_.insert(key);
}

std::vector<std::string> ConfigReader::UnreadKeys() const {
  std::vector<std::string> unread;
  if (!config_.is_object()) return unread;
  for (auto it = config_.begin(); it != config_.end(); ++it) {
    if (!it.key().empty() && it.key()[0] != '_' && looked_up_.count(it.key()) == 0) unread.push_back(it.key());
  }
  std::sort(unread.begin(), unread.end());
  return unread;
}

int64_t ConfigReader::Int(const char* key, int64_t fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->is_number_integer()) return v->get<int64_t>();
  // diffusers configs sometimes store integral floats (e.g. 32.0).
  if (v->is_number_float() && v->get<double>() == static_cast<int64_t>(v->get<double>())) {
    return static_cast<int64_t>(v->get<double>());
  }
  TypeError(key, "an integer");
  return fallback;
}

double ConfigReader::Double(const char* key, double fallback) { return OptionalDouble(key).value_or(fallback); }

std::optional<double> ConfigReader::OptionalDouble(const char* key) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  TypeError(key, "a number");
  return std::nullopt;
}

bool ConfigReader::Bool(const char* key, bool fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->is_boolean()) return v->get<bool>();
  TypeError(key, "true or false");
  return fallback;
}

std::string ConfigReader::String(const char* key, const std::string& fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  if (v->is_string()) return v->get<std::string>();
  TypeError(key, "a string");
  return fallback;
}

std::optional<std::vector<int64_t>> ConfigReader::OptionalIntList(const char* key) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    TypeError(key, "a list of integers");
    return std::nullopt;
  }
  std::vector<int64_t> out;
  for (const auto& item : *v) {
    if (!item.is_number_integer()) {
      TypeError(key, "a list of integers");
      return std::nullopt;
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

std::vector<int64_t> ConfigReader::IntList(const char* key, const std::vector<int64_t>& fallback) {
  return OptionalIntList(key).value_or(fallback);
}

std::vector<std::vector<int64_t>> ConfigReader::IntLists(const char* key,
                                                         const std::vector<std::vector<int64_t>>& fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  std::vector<std::vector<int64_t>> out;
  for (const auto& list : v->is_array() ? *v : nlohmann::json::array()) {
    std::vector<int64_t> items;
    for (const auto& item : list.is_array() ? list : nlohmann::json::array()) {
      if (!item.is_number_integer()) break;
      items.push_back(item.get<int64_t>());
    }
    if (!list.is_array() || items.size() != list.size()) break;
    out.push_back(std::move(items));
  }
  if (!v->is_array() || out.size() != v->size()) {
    TypeError(key, "a list of lists of integers");
    return fallback;
  }
  return out;
}

std::optional<std::vector<double>> ConfigReader::OptionalDoubleList(const char* key) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    TypeError(key, "a list of numbers");
    return std::nullopt;
  }
  std::vector<double> out;
  for (const auto& item : *v) {
    if (!item.is_number()) {
      TypeError(key, "a list of numbers");
      return std::nullopt;
    }
    out.push_back(item.get<double>());
  }
  return out;
}

std::vector<std::string> ConfigReader::StringList(const char* key, const std::vector<std::string>& fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  std::vector<std::string> out;
  if (v->is_array()) {
    for (const auto& item : *v) {
      if (!item.is_string()) break;
      out.push_back(item.get<std::string>());
    }
    if (out.size() == v->size()) return out;
  }
  TypeError(key, "a list of strings");
  return fallback;
}

std::vector<bool> ConfigReader::BoolList(const char* key, const std::vector<bool>& fallback) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return fallback;
  std::vector<bool> out;
  if (v->is_array()) {
    for (const auto& item : *v) {
      if (!item.is_boolean()) break;
      out.push_back(item.get<bool>());
    }
    if (out.size() == v->size()) return out;
  }
  TypeError(key, "a list of booleans");
  return fallback;
}

absl::Status ConfigReader::status() const {
  if (errors_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(source_, ": ", absl::StrJoin(errors_, "; ")));
}

}  // namespace vaedecode::families
