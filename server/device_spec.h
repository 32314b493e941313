#pragma once

// --devices and --group_size: which worker processes the server starts and
// how they are carved into static groups at start-up.
//
//   cpu:N         N CPU workers, named cpu:0 … cpu:N-1
//   cuda:0,1,3    one worker per listed GPU, named cuda:0, cuda:1, cuda:3
//
// Groups take consecutive devices: with cuda:0,1,2,3 and group size 2, group
// g0 is {cuda:0, cuda:1} and g1 is {cuda:2, cuda:3}. The device count must
// be a multiple of the group size (no device is silently left idle).
//
// Thread-safe: pure functions.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vaedecode::server {

// Parses a --devices value into device names ("cpu:0", "cuda:1", …).
// INVALID_ARGUMENT naming the problem for anything else.
absl::StatusOr<std::vector<std::string>> ParseDevices(const std::string& spec);

struct GroupSpec {
  std::string name;                  // "g0", "g1", …
  std::vector<std::string> devices;  // rank r runs on devices[r]
};

absl::StatusOr<std::vector<GroupSpec>> CarveGroups(const std::vector<std::string>& devices, int group_size);

}  // namespace vaedecode::server
