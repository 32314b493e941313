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

namespace vaedecode::worker {

class ChildProcess {
 public:
  // argv[0] is the executable path (not searched in PATH).
  static absl::StatusOr<ChildProcess> Spawn(const std::vector<std::string>& argv);

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

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;  // -1 once reaped
};

// Path of the running executable (/proc/self/exe resolved).
std::string SelfExecutable();

}  // namespace vaedecode::worker
