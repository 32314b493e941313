#include "parallel/testing/multi_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string_view>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "parallel/store.h"
#include "rpc/free_port.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel::testing {
namespace {

// What a child writes to its pipe: "<status code>\n<message>".
std::string EncodeStatus(const absl::Status& status) {
  return absl::StrCat(static_cast<int>(status.code()), "\n", status.message());
}

bool DecodeStatus(const std::string& report, absl::Status* status) {
  const size_t newline = report.find('\n');
  if (newline == std::string::npos) return false;
  int code = 0;
  if (!absl::SimpleAtoi(absl::string_view(report).substr(0, newline), &code)) {
    return false;
  }
  *status = absl::Status(static_cast<absl::StatusCode>(code), absl::string_view(report).substr(newline + 1));
  return true;
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void RunChild(const RunRanksOptions& options, const RankBody& body, int rank, int port, int report_fd,
                           pid_t parent) {
  // Die with the parent; lead a process group so a kill reaches helpers too.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(3);
  ::setpgid(0, 0);

  absl::Status status;
  try {
    if (options.child_intra_op_threads > 0) {
      at::set_num_threads(options.child_intra_op_threads);
    }
    status = body(rank, options.world_size, port);
  } catch (const c10::Error& e) {
    status = absl::InternalError(absl::StrCat("uncaught c10::Error: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("uncaught exception: ", e.what()));
  } catch (...) {
    status = absl::InternalError("uncaught non-standard exception");
  }
  WriteAll(report_fd, EncodeStatus(status));
  ::close(report_fd);
  std::fflush(nullptr);
  // Skip atexit handlers and static destructors: they belong to the parent
  // (gtest, LibTorch globals).
  ::_exit(0);
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the report pipe; -1 once at EOF
  std::string report;
  bool reaped = false;
  int wait_status = 0;
  bool killed_at_timeout = false;
  absl::Time started;
  absl::Time ended;
};

void KillGroup(pid_t pid) {
  ::kill(-pid, SIGKILL);  // the child's process group (itself and helpers)
  ::kill(pid, SIGKILL);   // in case it died before setpgid
}

void DrainPipe(Child& child) {
  if (child.fd < 0) return;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(child.fd, buffer, sizeof(buffer));
    if (n > 0) {
      child.report.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    ::close(child.fd);  // EOF or error
    child.fd = -1;
    return;
  }
}

absl::Status OutcomeStatus(const Child& child, absl::Duration timeout) {
  if (child.killed_at_timeout) {
    return absl::DeadlineExceededError(absl::StrCat("killed after the ", absl::FormatDuration(timeout), " timeout"));
  }
  absl::Status reported;
  const bool has_report = DecodeStatus(child.report, &reported);
  if (WIFSIGNALED(child.wait_status)) {
    const int sig = WTERMSIG(child.wait_status);
    return absl::InternalError(absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")"));
  }
  if (WIFEXITED(child.wait_status) && WEXITSTATUS(child.wait_status) != 0) {
    return absl::InternalError(
        absl::StrCat("exited with code ", WEXITSTATUS(child.wait_status),
                     has_report ? absl::StrCat(" after reporting ", reported.ToString()) : " without reporting"));
  }
  if (!has_report) {
    return absl::InternalError("exited without reporting a status");
  }
  return reported;
}

}  // namespace

absl::StatusOr<std::vector<RankOutcome>> RunRanksCollect(const RunRanksOptions& options, const RankBody& body) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError("RunRanks: world_size must be >= 1");
  }
  // Held until every child is reaped (rank 0 binds its store beside it).
  ASSIGN_OR_RETURN(rpc::ReservedPort reserved, rpc::ReservedPort::Take());
  const int port = reserved.port();

  // Buffered output would otherwise be written once by every child too.
  std::fflush(nullptr);
  std::cout.flush();
  std::cerr.flush();

  const pid_t parent = ::getpid();
  std::vector<Child> children(options.world_size);
  for (int rank = 0; rank < options.world_size; ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      const int err = errno;
      for (int r = 0; r < rank; ++r) {
        KillGroup(children[r].pid);
        ::waitpid(children[r].pid, nullptr, 0);
        ::close(children[r].fd);
      }
      return absl::InternalError(absl::StrCat("RunRanks: pipe: ", std::strerror(err)));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      for (int r = 0; r < rank; ++r) ::close(children[r].fd);
      RunChild(options, body, rank, port, fds[1], parent);
    }
    if (pid < 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      for (int r = 0; r < rank; ++r) {
        KillGroup(children[r].pid);
        ::waitpid(children[r].pid, nullptr, 0);
        ::close(children[r].fd);
      }
      return absl::InternalError(absl::StrCat("RunRanks: fork: ", std::strerror(err)));
    }
    ::setpgid(pid, pid);  // also set by the child; whichever runs first wins
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children[rank].pid = pid;
    children[rank].fd = fds[0];
    children[rank].started = absl::Now();
  }

  const absl::Time deadline = absl::Now() + options.timeout;
  while (true) {
    bool all_reaped = true;
    for (Child& child : children) {
      if (child.reaped) continue;
      int wait_status = 0;
      const pid_t r = ::waitpid(child.pid, &wait_status, WNOHANG);
      if (r == child.pid) {
        child.reaped = true;
        child.wait_status = wait_status;
        child.ended = absl::Now();
        DrainPipe(child);
      } else {
        all_reaped = false;
      }
    }
    if (all_reaped) break;
    if (absl::Now() >= deadline) {
      for (Child& child : children) {
        if (child.reaped) continue;
        KillGroup(child.pid);
        int wait_status = 0;
        while (::waitpid(child.pid, &wait_status, 0) < 0 && errno == EINTR) {
        }
        child.reaped = true;
        child.killed_at_timeout = true;
        child.wait_status = wait_status;
        child.ended = absl::Now();
        DrainPipe(child);
      }
      break;
    }
    // Read reports as they come (a large one must not fill the pipe and
    // block its writer), waking at least every 20 ms to reap.
    std::vector<pollfd> fds;
    for (const Child& child : children) {
      if (child.fd >= 0) fds.push_back(pollfd{child.fd, POLLIN, 0});
    }
    const int wait_ms = static_cast<int>(
        std::min<int64_t>(20, std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()))));
    if (fds.empty()) {
      ::usleep(static_cast<useconds_t>(wait_ms) * 1000);
    } else {
      ::poll(fds.data(), fds.size(), wait_ms);
    }
    for (Child& child : children) DrainPipe(child);
  }

  std::vector<RankOutcome> outcomes;
  outcomes.reserve(children.size());
  for (int rank = 0; rank < options.world_size; ++rank) {
    Child& child = children[rank];
    // Helpers a body left behind die with the rank's process group.
    KillGroup(child.pid);
    if (child.fd >= 0) {
      // The writer is gone (reaped); whatever remains is readable now, and a
      // helper still holding the write end must not block us.
      DrainPipe(child);
      if (child.fd >= 0) ::close(child.fd);
      child.fd = -1;
    }
    outcomes.push_back(
        RankOutcome{rank, OutcomeStatus(child, options.timeout), child.ended - child.started, child.killed_at_timeout});
  }
  return outcomes;
}

std::string DescribeFailures(const std::vector<RankOutcome>& outcomes) {
  int failed = 0;
  std::string details;
  for (const RankOutcome& outcome : outcomes) {
    if (outcome.status.ok()) continue;
    ++failed;
    absl::StrAppend(&details, failed > 1 ? "; " : "", "rank ", outcome.rank, ": ", outcome.status.ToString());
  }
  if (failed == 0) return "";
  return absl::StrCat(failed, " of ", outcomes.size(), " ranks failed: ", details);
}

absl::Status RunRanks(const RunRanksOptions& options, const RankBody& body) {
  ASSIGN_OR_RETURN(std::vector<RankOutcome> outcomes, RunRanksCollect(options, body));
  absl::StatusCode code = absl::StatusCode::kOk;
  for (const RankOutcome& outcome : outcomes) {
    if (outcome.status.ok()) continue;
    if (outcome.timed_out) {
      code = absl::StatusCode::kDeadlineExceeded;
      break;
    }
    if (code == absl::StatusCode::kOk) code = outcome.status.code();
  }
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, DescribeFailures(outcomes));
}

absl::Status RunRanks(int world_size, const RankBody& body, absl::Duration timeout) {
  RunRanksOptions options;
  options.world_size = world_size;
  options.timeout = timeout;
  return RunRanks(options, body);
}

}  // namespace vaedecode::parallel::testing
