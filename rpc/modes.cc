#include "rpc/modes.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::rpc {

const std::vector<std::string>& ModeNames() {
  static const auto* names = [] {
    auto* n = new std::vector<std::string>;
    const google::protobuf::EnumDescriptor* e = v1::Mode_descriptor();
    for (int i = 0; i < e->value_count(); ++i) n->push_back(ModeName(static_cast<v1::Mode>(e->value(i)->number())));
    return n;
  }();
  return *names;
}

std::string ModeLabel(v1::Mode mode) {
  if (!v1::Mode_IsValid(mode)) return absl::StrCat("MODE_", static_cast<int>(mode));
  // MODE_EXACT -> EXACT
  return v1::Mode_Name(mode).substr(5);
}

std::string ModeName(v1::Mode mode) { return absl::AsciiStrToLower(ModeLabel(mode)); }

absl::StatusOr<v1::Mode> ParseMode(absl::string_view text) {
  v1::Mode mode;
  if (v1::Mode_Parse(absl::StrCat("MODE_", absl::AsciiStrToUpper(text)), &mode)) return mode;
  const std::vector<std::string>& names = ModeNames();
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\"; use ", absl::StrJoin(names.begin(), names.end() - 1, ", "), " or ", names.back()));
}

}  // namespace vaedecode::rpc
