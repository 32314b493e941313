#pragma once

// A child process started with fork + exec, killed with SIGKILL if the parent
// dies (PR_SET_PDEATHSIG), and killed and reaped when the handle is destroyed,
// so no child outlives the code that started it.
//
// Threading: one thread uses a handle at a time.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vaedecode::rpc {

// What a child gets besides its argv.
struct SpawnOptions {
  // A descriptor of the parent's that the child inherits as fd 3 (a
  // heartbeat pipe's write end, say); -1: none. Every other descriptor the
  // parent opened close-on-exec stays closed.
  int fd3 = -1;
  // When set, the child's stdout and stderr are appended to this file.
  std::string output_file;
};

class ChildProcess {
 public:
  // argv[0] is the executable path (not searched in PATH).
  static absl::StatusOr<ChildProcess> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options = {});

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }

  // Waits for the child to exit: its exit code (128 + signal when killed by
  // one), or DEADLINE_EXCEEDED when it is still running at `deadline`.
  absl::StatusOr<int> Wait(absl::Time deadline);

  // SIGKILL and reap; a no-op once reaped.
  void Kill();
  // Sends `sig` (a no-op once reaped).
  void Signal(int sig);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;  // -1 once reaped
};

// Path of the running executable (/proc/self/exe resolved).
std::string SelfExecutable();

}  // namespace vaedecode::rpc
