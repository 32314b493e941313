#pragma once

// Client-supplied strings (request ids, model names, error messages that
// quote them) go into key=value log lines. Written raw, a newline forges a
// log line and a space forges a field; LogValue makes any string one token.
//
// Thread-safe: pure function.

#include <string>
#include "absl/strings/string_view.h"

namespace vaedecode::rpc {

// `value` unchanged when it is a plain token (letters, digits and ._:/@+-,
// not empty); otherwise double-quoted with every quote, backslash and
// non-printable byte C-escaped ("a\nb" -> "\"a\\nb\"").
std::string LogValue(absl::string_view value);

}  // namespace vaedecode::rpc
