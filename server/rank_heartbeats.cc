#include "server/rank_heartbeats.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace vaedecode::server {

absl::StatusOr<RankHeartbeats> RankHeartbeats::Create(int ranks) {
  RankHeartbeats h;
  for (int r = 0; r < ranks; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::UnavailableError(absl::StrCat("heartbeat pipe: ", std::strerror(errno)));
    }
    // Only the read end stays non-blocking: the worker sets its own end.
    fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) & ~O_NONBLOCK);
    h.read_fds_.push_back(fds[0]);
    h.write_fds_.push_back(fds[1]);
    h.last_heard_.push_back(absl::InfinitePast());
  }
  return h;
}

RankHeartbeats::RankHeartbeats(RankHeartbeats&& other) noexcept
    : read_fds_(std::move(other.read_fds_)),
      write_fds_(std::move(other.write_fds_)),
      last_heard_(std::move(other.last_heard_)) {
  other.read_fds_.clear();
  other.write_fds_.clear();
}

RankHeartbeats& RankHeartbeats::operator=(RankHeartbeats&& other) noexcept {
  if (this != &other) {
    CloseAll();
    read_fds_ = std::move(other.read_fds_);
    write_fds_ = std::move(other.write_fds_);
    last_heard_ = std::move(other.last_heard_);
    other.read_fds_.clear();
    other.write_fds_.clear();
  }
  return *this;
}

RankHeartbeats::~RankHeartbeats() { CloseAll(); }

void RankHeartbeats::CloseAll() {
  for (int fd : read_fds_) {
    if (fd >= 0) close(fd);
  }
  CloseWriteEnds();
  read_fds_.clear();
}

void RankHeartbeats::CloseWriteEnds() {
  for (int& fd : write_fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

void RankHeartbeats::Drain() {
  const absl::Time now = absl::Now();
  char buf[256];
  for (size_t r = 0; r < read_fds_.size(); ++r) {
    while (true) {
      const ssize_t n = read(read_fds_[r], buf, sizeof(buf));
      if (n > 0) {
        last_heard_[r] = now;
        continue;
      }
      break;  // 0: the rank exited (the supervisor reaps it); -1: nothing more now
    }
  }
}

int RankHeartbeats::FindSilent(absl::Duration timeout, absl::Duration* silent_for) {
  Drain();
  const absl::Time now = absl::Now();
  for (size_t r = 0; r < last_heard_.size(); ++r) {
    if (last_heard_[r] == absl::InfinitePast()) continue;
    if (now - last_heard_[r] > timeout) {
      if (silent_for != nullptr) *silent_for = now - last_heard_[r];
      return static_cast<int>(r);
    }
  }
  return -1;
}

void RankHeartbeats::HeardAllNow() {
  Drain();
  for (absl::Time& t : last_heard_) t = absl::Now();
}

}  // namespace vaedecode::server
