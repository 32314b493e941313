#include "server/device_spec.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace vaedecode::server {
namespace {

constexpr int kMaxDevices = 1024;

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& spec) {
  const auto bad = [&spec](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=\"", spec, "\": ", why, " (expected cpu:N or cuda:I,J,…)"));
  };
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return bad("no device kind");
  const std::string kind = spec.substr(0, colon);
  const std::string rest = spec.substr(colon + 1);
  std::vector<std::string> out;
  if (kind == "cpu") {
    int n = 0;
    if (!absl::SimpleAtoi(rest, &n) || n < 1 || n > kMaxDevices) {
      return bad("the CPU worker count must be an integer in [1, 1024]");
    }
    for (int i = 0; i < n; ++i) out.push_back(absl::StrCat("cpu:", i));
    return out;
  }
  if (kind == "cuda") {
    std::set<int> seen;
    for (absl::string_view part : absl::StrSplit(rest, ',')) {
      int index = 0;
      if (!absl::SimpleAtoi(part, &index) || index < 0 || index >= kMaxDevices) {
        return bad(absl::StrCat("\"", part, "\" is not a GPU index"));
      }
      if (!seen.insert(index).second) {
        return bad(absl::StrCat("GPU ", index, " is listed twice"));
      }
      out.push_back(absl::StrCat("cuda:", index));
    }
    return out;
  }
  return bad(absl::StrCat("unknown device kind \"", kind, "\""));
}

absl::StatusOr<std::vector<GroupSpec>> CarveGroups(const std::vector<std::string>& devices, int group_size) {
  if (group_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--group_size=", group_size, ": must be at least 1"));
  }
  if (devices.empty() || devices.size() % group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices lists ", devices.size(), " device(s), not a multiple of --group_size=", group_size));
  }
  std::vector<GroupSpec> groups;
  for (size_t begin = 0; begin < devices.size(); begin += group_size) {
    GroupSpec g;
    g.name = absl::StrCat("g", groups.size());
    g.devices.assign(devices.begin() + begin, devices.begin() + begin + group_size);
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace vaedecode::server
