#include "rpc/log_field.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace vaedecode::rpc {
namespace {

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '/' ||
         c == '@' || c == '+' || c == '-' || c == ',' || c == '[' || c == ']';
}

}  // namespace

std::string LogValue(absl::string_view value) {
  if (!value.empty() && std::all_of(value.begin(), value.end(), IsTokenChar)) {
    return std::string(value);
  }
  return absl::StrCat("\"", absl::CEscape(value), "\"");
}

}  // namespace vaedecode::rpc
