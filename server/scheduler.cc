#include "server/scheduler.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace vaedecode::server {

Scheduler::Scheduler(int64_t max_queue, std::function<void(int64_t)> on_depth)
    : max_queue_(max_queue), on_depth_(std::move(on_depth)) {}

void Scheduler::ReportDepth(int64_t depth) {
  if (on_depth_) on_depth_(depth);
}

bool Scheduler::ArmHook(const std::shared_ptr<Job>& job) {
  // A weak reference: the hook lives inside the job.
  std::weak_ptr<Job> weak = job;
  return job->SetCancelHook([this, weak] {
    if (std::shared_ptr<Job> j = weak.lock()) Remove(j.get());
  });
}

absl::Status Scheduler::Enqueue(std::shared_ptr<Job> job) {
  // Armed before any dispatcher can take the job: the dispatcher's own hook
  // (which cancels the call to the group) replaces this one, never the other
  // way round. Outside our lock (lock order Job, then Scheduler). A
  // cancellation that raced ahead needs no queue: the job finishes itself.
  if (!ArmHook(job)) return absl::OkStatus();
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      refused = absl::UnavailableError("the server is shutting down; retry on another replica");
    } else if (static_cast<int64_t>(queue_.size()) >= max_queue_) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("the request queue is full (", max_queue_, " waiting); retry later"));
    } else {
      queue_.push_back(job);
      ReportDepth(static_cast<int64_t>(queue_.size()));
      cv_.SignalAll();
    }
  }
  if (!refused.ok()) {
    job->ClearCancelHook();
  } else if (job->over()) {
    Remove(job.get());  // cancelled between arming and queueing: its hook found nothing to remove
  }
  return refused;
}

std::shared_ptr<Job> Scheduler::Next(const std::function<bool(const Job&)>& can_run, absl::Duration timeout) {
  // Queued deadlines are also enforced by gRPC cancelling the call (which
  // removes the job); the poll only bounds how late a missed one is noticed.
  constexpr absl::Duration kPoll = absl::Milliseconds(50);
  const absl::Time until = absl::Now() + timeout;
  std::vector<std::shared_ptr<Job>> expired;
  std::shared_ptr<Job> picked;
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      const absl::Time now = absl::Now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->deadline() <= now) {
          expired.push_back(std::move(*it));
          it = queue_.erase(it);
        } else if (!picked && can_run(**it)) {
          picked = std::move(*it);
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (picked || !expired.empty() || (closed_ && queue_.empty()) || now >= until) break;
      cv_.WaitWithDeadline(&mu_, std::min(until, now + kPoll));
    }
    if (picked || !expired.empty()) ReportDepth(static_cast<int64_t>(queue_.size()));
  }
  for (const auto& job : expired) {
    job->ClearCancelHook();
    job->Finish(absl::DeadlineExceededError("deadline exceeded while waiting in the queue for a worker group"));
  }
  if (picked) picked->ClearCancelHook();
  return picked;
}

bool Scheduler::Requeue(std::shared_ptr<Job> job) {
  // Armed first, as in Enqueue; a cancelled job is not put back.
  if (!ArmHook(job)) return false;
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      queue_.push_front(job);
      ReportDepth(static_cast<int64_t>(queue_.size()));
      cv_.SignalAll();
      queued = true;
    }
  }
  if (!queued) {
    job->ClearCancelHook();
  } else if (job->over()) {
    Remove(job.get());
  }
  return queued;
}

void Scheduler::FailQueued(const std::function<absl::Status(const Job&)>& why) {
  std::vector<std::pair<std::shared_ptr<Job>, absl::Status>> failed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      absl::Status status = why(**it);
      if (status.ok()) {
        ++it;
        continue;
      }
      failed.emplace_back(std::move(*it), std::move(status));
      it = queue_.erase(it);
    }
    if (!failed.empty()) ReportDepth(static_cast<int64_t>(queue_.size()));
  }
  for (auto& [job, status] : failed) {
    job->ClearCancelHook();
    job->Finish(std::move(status));
  }
}

void Scheduler::Remove(const Job* job) {
  std::shared_ptr<Job> removed;  // released after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->get() == job) {
      removed = std::move(*it);
      queue_.erase(it);
      ReportDepth(static_cast<int64_t>(queue_.size()));
      break;
    }
  }
}

void Scheduler::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

bool Scheduler::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

int64_t Scheduler::depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace vaedecode::server
