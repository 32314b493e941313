#pragma once

// Command-line parsing for the `vaedecode` CLI: `vaedecode COMMAND [--flag value]...`.
// Flags take `--name value` or `--name=value`; unknown flags are errors.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vaedecode::cli {

struct ParsedArgs {
  std::string command;
  std::map<std::string, std::string> flags;  // without the leading "--"

  std::optional<std::string> Get(const std::string& name) const;
};

// `allowed` lists the flags of each command; a bare flag (no value) is an error.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& argv,
                                     const std::map<std::string, std::set<std::string>>& allowed);

// "1,4,32,32" -> {1, 4, 32, 32}; every entry positive.
absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text);

// A path given relative to the directory `bazel run` was called from.
std::string ResolveUserPath(const std::string& path);

}  // namespace vaedecode::cli
