#pragma once

// Liveness of a worker group's processes, independent of what they compute.
// Each rank's process gets the write end of a pipe (as fd 3,
// `--heartbeat_fd=3`) and a thread of its own writes a byte to it every
// 250 ms (worker/worker_main.cc), whatever the rank's main thread is doing (a long op, a
// collective). A rank whose bytes stop arriving is stopped (SIGSTOP),
// swapped out or wedged in the kernel: the supervisor fails the group within
// the timeout instead of waiting out the collective timeout (minutes).
//
// Threading: one thread (the group's supervisor) uses an instance.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vaedecode::server {

class RankHeartbeats {
 public:
  // One pipe per rank (both ends close-on-exec; the reads never block).
  static absl::StatusOr<RankHeartbeats> Create(int ranks);
  RankHeartbeats(RankHeartbeats&& other) noexcept;
  RankHeartbeats& operator=(RankHeartbeats&& other) noexcept;
  RankHeartbeats(const RankHeartbeats&) = delete;
  RankHeartbeats& operator=(const RankHeartbeats&) = delete;
  ~RankHeartbeats();

  // The descriptor rank `r`'s process inherits (SpawnOptions::fd3).
  int write_fd(int r) const { return write_fds_[r]; }
  // After spawning: the parent keeps only the read ends, so a rank that
  // exits shows as end-of-file, not as silence.
  void CloseWriteEnds();

  // Reads what has arrived. Returns the first rank that has been heard from
  // before but not within `timeout`, with how long it has been silent; -1
  // when every rank that has spoken is on time. A rank that never spoke
  // (still starting) is left to the start-up timeout.
  int FindSilent(absl::Duration timeout, absl::Duration* silent_for);
  // Counts every rank as heard from now (when the group becomes ready:
  // from here on, silence is a hang).
  void HeardAllNow();

 private:
  RankHeartbeats() = default;
  void Drain();
  void CloseAll();

  std::vector<int> read_fds_;
  std::vector<int> write_fds_;
  std::vector<absl::Time> last_heard_;  // InfinitePast: not yet
};

}  // namespace vaedecode::server
