#include "cli/args.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vaedecode::cli {

std::optional<std::string> ParsedArgs::Get(const std::string& name) const {
  auto it = flags.find(name);
  if (it == flags.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& argv,
                                     const std::map<std::string, std::set<std::string>>& allowed) {
  if (argv.empty()) return absl::InvalidArgumentError("missing command");
  ParsedArgs out;
  out.command = argv[0];
  auto commands = allowed.find(out.command);
  if (commands == allowed.end()) {
    std::vector<std::string> names;
    for (const auto& [name, flags] : allowed) names.push_back(name);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command \"", out.command, "\" (commands: ", absl::StrJoin(names, ", "), ")"));
  }
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argv.size()) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    if (!commands->second.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " for \"", out.command, "\" (flags: --",
                                                     absl::StrJoin(commands->second, ", --"), ")"));
    }
    if (!out.flags.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given twice"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad shape \"", text, "\": expected positive integers like 1,4,32,32"));
    }
    shape.push_back(v);
  }
  return shape;
}

std::string ResolveUserPath(const std::string& path) {
  const char* caller_dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || caller_dir == nullptr) return path;
  return absl::StrCat(caller_dir, "/", path);
}

}  // namespace vaedecode::cli
