#pragma once

// Typed reads of a diffusers config.json with diffusers' constructor defaults.
//
// A missing key or JSON null yields the fallback, as diffusers' `register_to_config`
// does; a present key of the wrong type is recorded as an error and the fallback is
// returned, so a family reads every field and then checks status() once.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"

namespace vaedecode::families {

class ConfigReader {
 public:
  // `config` must outlive the reader. `source` names the file in errors.
  ConfigReader(const nlohmann::json& config, std::string source);

  int64_t Int(const char* key, int64_t fallback);
  double Double(const char* key, double fallback);
  std::optional<double> OptionalDouble(const char* key);
  bool Bool(const char* key, bool fallback);
  std::string String(const char* key, const std::string& fallback);
  std::vector<int64_t> IntList(const char* key, const std::vector<int64_t>& fallback);
  std::optional<std::vector<int64_t>> OptionalIntList(const char* key);
  std::optional<std::vector<double>> OptionalDoubleList(const char* key);
  // A list of lists of integers (BigVGAN-lineage dilations, [[1, 3, 5], ...]).
  std::vector<std::vector<int64_t>> IntLists(const char* key, const std::vector<std::vector<int64_t>>& fallback);
  std::vector<std::string> StringList(const char* key, const std::vector<std::string>& fallback);
  std::vector<bool> BoolList(const char* key, const std::vector<bool>& fallback);

  // Records a semantic error found by the caller (e.g. lists of unequal length).
  void Fail(const std::string& message);
  // Fails unless `act_fn` is SiLU by one of diffusers' names (its
  // get_activation maps "silu" and "swish" to nn.SiLU), the only activation
  // the decoders implement.
  void RequireSilu(const std::string& act_fn);

  // OK, or InvalidArgument listing every problem seen.
  absl::Status status() const;

  // Keys the family accepts but does not read (the encoder's, training
  // settings): UnreadKeys leaves them out.
  void Known(std::initializer_list<const char*> keys);
  // The config's keys no getter looked up and Known() did not name, but
  // diffusers' own "_" ones: a misspelt key, or one from another class,
  // which diffusers would also ignore (sorted).
  std::vector<std::string> UnreadKeys() const;

 private:
  const nlohmann::json* Find(const char* key) const;  // nullptr when missing or null
  void TypeError(const char* key, const char* expected);

  const nlohmann::json& config_;
  std::string source_;
  std::vector<std::string> errors_;
  mutable std::set<std::string> looked_up_;  // every key Find was asked for
};

}  // namespace vaedecode::families
