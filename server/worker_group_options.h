#pragma once

// How one static worker group is made and watched (server/worker_group.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace vaedecode::server {

struct WorkerGroupOptions {
  std::string name;                  // "g0"
  std::vector<std::string> devices;  // rank r runs on devices[r]
  std::string worker_binary;         // path of vaedecode_worker
  std::string model_repository;      // "" = the embedded default model
  std::string dtype = "float32";
  int threads = 1;  // intra-op threads per worker
  int collective_timeout_s = 300;
  int64_t memory_budget_mib = 0;
  std::string socket_dir;  // leader sockets go here (short path: 108-byte limit)
  absl::Duration start_timeout = absl::Minutes(5);
  int64_t max_chunk_bytes = 1 << 20;
  absl::Duration restart_backoff = absl::Milliseconds(500);  // after a failed start; doubles
  absl::Duration max_restart_backoff = absl::Seconds(30);
  // A rank whose heartbeats stop for this long is hung: the group is failed
  // and rebuilt. Zero: no heartbeats (only exits and collective timeouts).
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // A leader still busy this long after its request was cancelled is
  // rebuilt (it is out of rotation, and readiness false, from 5 s on).
  absl::Duration cancel_release_timeout = absl::Seconds(30);
};

}  // namespace vaedecode::server
