#pragma once

// The decode modes' one parse and print, for every front end (HTTP query,
// OIP parameter, CLI and client flags), the metrics and the logs.
//
// Thread-safe: pure functions.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// "auto", "dense", "exact", "tiled" (any case) -> v1::Mode. INVALID_ARGUMENT
// "\"fast\"; use auto, dense, exact or tiled" otherwise.
absl::StatusOr<v1::Mode> ParseMode(absl::string_view text);
// "dense": the name ParseMode reads.
std::string ModeName(v1::Mode mode);
// "DENSE": the label of metrics and the request log line.
std::string ModeLabel(v1::Mode mode);
// Every mode's name, in the enum's order.
const std::vector<std::string>& ModeNames();

}  // namespace vaedecode::rpc
