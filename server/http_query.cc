#include "server/http_query.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace vaedecode::server {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string DecodeQueryComponent(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 && HexValue(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

QueryParams ParseQuery(absl::string_view target) {
  QueryParams params;
  const size_t q = target.find('?');
  if (q == absl::string_view::npos) return params;
  for (absl::string_view pair : absl::StrSplit(target.substr(q + 1), '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    const absl::string_view key = pair.substr(0, eq);
    const absl::string_view value = eq == absl::string_view::npos ? absl::string_view() : pair.substr(eq + 1);
    params.emplace(DecodeQueryComponent(key), DecodeQueryComponent(value));
  }
  return params;
}

absl::Status BadQueryParam(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("query parameter ", name, ": ", why));
}

absl::StatusOr<const std::string*> SingleQueryParam(const QueryParams& params, const std::string& name) {
  const auto [begin, end] = params.equal_range(name);
  if (begin == end) return nullptr;
  if (std::next(begin) != end) return BadQueryParam(name, "given more than once");
  return &begin->second;
}

absl::StatusOr<bool> ParseBoolQueryParam(const std::string& name, const std::string& value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return BadQueryParam(name, absl::StrCat("\"", value, "\" is not True or False"));
}

absl::StatusOr<int64_t> ParsePositiveQueryParam(const std::string& name, const std::string& value) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 1) {
    return BadQueryParam(name, absl::StrCat("\"", value, "\" is not a positive integer"));
  }
  return n;
}

absl::StatusOr<std::vector<int64_t>> RepeatedPositiveQueryParam(const QueryParams& params, const std::string& name) {
  std::vector<int64_t> out;
  for (auto [it, end] = params.equal_range(name); it != end; ++it) {
    absl::StatusOr<int64_t> d = ParsePositiveQueryParam(name, it->second);
    if (!d.ok()) return d.status();
    out.push_back(*d);
  }
  return out;
}

}  // namespace vaedecode::server
