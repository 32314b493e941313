#pragma once

// The query string of an HTTP request target, as the protocols read it:
// every key=value pair kept in order (a key may repeat: remote_decode sends
// shape=1&shape=4&...; httplib's own parse drops repeated identical pairs),
// keys and values percent-decoded with '+' as a space.
//
// Thread-safe: pure functions.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vaedecode::server {

// Query parameters (a key may repeat; equal keys keep their order).
using QueryParams = std::multimap<std::string, std::string>;

// The pairs after the first '?' of `target` ("/path?a=1&b=2"); empty
// pieces are skipped, a piece without '=' is a key with an empty value.
QueryParams ParseQuery(absl::string_view target);

// application/x-www-form-urlencoded decoding of one key or value: "%XX" is
// the byte XX, '+' is a space; a '%' not followed by two hex digits is kept
// as it is.
std::string DecodeQueryComponent(absl::string_view text);

// INVALID_ARGUMENT "query parameter NAME: WHY".
absl::Status BadQueryParam(absl::string_view name, absl::string_view why);
// The one value of `name`, or nullptr; more than one is an error.
absl::StatusOr<const std::string*> SingleQueryParam(const QueryParams& params, const std::string& name);
// Python's str(bool) as requests sends it, and the usual spellings.
absl::StatusOr<bool> ParseBoolQueryParam(const std::string& name, const std::string& value);
absl::StatusOr<int64_t> ParsePositiveQueryParam(const std::string& name, const std::string& value);
// Every value of a repeated positive parameter (remote_decode's shape=1&shape=4&...), in order.
absl::StatusOr<std::vector<int64_t>> RepeatedPositiveQueryParam(const QueryParams& params, const std::string& name);

}  // namespace vaedecode::server
