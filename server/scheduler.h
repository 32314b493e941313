#pragma once

// The frontend's bounded request queue. Jobs wait here until a worker group
// takes them; the oldest job a group can run goes first (FIFO per group: with
// every group serving every model this is one FIFO shared by all groups, and
// a group that is rebuilding simply stops taking jobs).
//
// Ownership: Enqueue shares the job with the queue; the queue drops its
// reference when a group takes the job, when the job is cancelled (its
// cancel hook removes it), when its deadline passes while queued (finished
// with DEADLINE_EXCEEDED) or when the scheduler is closed with jobs left.
//
// Threading: every method is thread-safe. Next blocks (dispatcher threads
// only); the other methods never block beyond the scheduler's lock, so
// gRPC's callback threads may call them. The scheduler never calls into a
// Job while holding its own lock (lock order: Job, then Scheduler).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job.h"

namespace vaedecode::server {

class Scheduler {
 public:
  // `max_queue` jobs may wait at once. `on_depth` (may be empty) is told the
  // depth after every change, under the scheduler's lock (so reports arrive
  // in order): it must not call back into the scheduler.
  Scheduler(int64_t max_queue, std::function<void(int64_t)> on_depth);

  // Arms the job's cancel hook, then queues it (a dispatcher that takes it
  // arms its own hook, which nothing replaces). RESOURCE_EXHAUSTED at once when
  // the queue is full, UNAVAILABLE once closed; the job is not queued then
  // (the caller finishes it).
  absl::Status Enqueue(std::shared_ptr<Job> job);

  // Waits up to `timeout` for the oldest job `can_run` accepts, removes it
  // and disarms its cancel hook; nullptr on timeout or when closed and empty.
  // Jobs found past their deadline are finished with DEADLINE_EXCEEDED.
  std::shared_ptr<Job> Next(const std::function<bool(const Job&)>& can_run, absl::Duration timeout);

  // Puts a job a group took back at the head of the queue (the group broke
  // before starting it). Ignores the bound; false, nothing queued, when
  // closed or the job is over.
  bool Requeue(std::shared_ptr<Job> job);

  // Removes `job` if queued (a no-op otherwise).
  void Remove(const Job* job);

  // Finishes every queued job for which `why` is not OK with that status
  // (a model that stopped loading: its jobs fail now rather than wait for
  // a group that will never serve them). `why` runs under the scheduler's
  // lock: it must not call back into the scheduler or a Job.
  void FailQueued(const std::function<absl::Status(const Job&)>& why);

  // Stops accepting new jobs; queued jobs stay and are still handed out.
  void Close();
  bool closed() const;

  int64_t depth() const;

 private:
  void ReportDepth(int64_t depth) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ArmHook(const std::shared_ptr<Job>& job);

  const int64_t max_queue_;
  const std::function<void(int64_t)> on_depth_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when a job is queued or the queue closes
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace vaedecode::server
