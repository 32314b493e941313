#pragma once

// One Decode call as the scheduler and the worker groups see it: the request,
// the model it was validated against, and the client stream's buffer.
//
// Ownership: a Job is shared (std::shared_ptr) by the call's reactor (until
// gRPC's OnDone), the scheduler's queue (while queued) and the dispatcher
// thread of the group running it. The stream it writes to is owned by gRPC;
// the Job calls it only until it has called Finish on it, and gRPC destroys
// it only after that (OnDone), so the raw pointer stays valid for every use.
//
// Threading: the "dispatcher side" is called by one thread at a time (the
// group dispatcher that took the job, or the scheduler failing a queued
// job); the "reactor side" by gRPC's callback threads. Push may block the
// dispatcher (bounded buffer: back-pressure reaches the leader's stream);
// nothing on the reactor side blocks. gRPC operations on the stream are
// always started outside the Job's lock. Lock order: Job, then the
// scheduler (a queued job's cancel hook removes it from the queue).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// The client side of a call as a Job sees it: implemented by the Decode
// reactor (forwarding to grpc::ServerWriteReactor), or by a fake in tests.
// The Job keeps at most one StartWrite outstanding, reports its completion
// through Job::OnWriteDone, and calls Finish once, last.
class JobStream {
 public:
  virtual ~JobStream() = default;
  virtual void StartWrite(const v1::DecodeResponse* message) = 0;
  virtual void Finish(const absl::Status& status) = 0;
};

// What the request log line and the metrics need once a job ends.
struct JobReport {
  std::string group;       // "" when it never reached a group
  std::string mode = "-";  // the mode the leader used
  std::string mode_reason;
  int degree = 0;
  std::vector<int64_t> output_shape;
  v1::Timings timings;  // filled as far as the job got
  int64_t collectives = 0;
  int tile_retries = 0;
  std::vector<int64_t> peak_bytes_per_rank;
  bool decoded = false;  // the leader sent its trailer
};

class Job {
 public:
  using DoneCallback = std::function<void(const Job& job, const absl::Status& status)>;

  // `model` is the description the request was validated against; `deadline`
  // is the call's (absl::InfiniteFuture() when none). At most `max_buffered`
  // messages wait for the client stream.
  Job(v1::DecodeRequest request, v1::ModelInfo model, absl::Time received, absl::Time deadline,
      size_t max_buffered);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Binds the client stream; once, before the job is shared. `done` runs
  // exactly once, right after the stream is finished, on whichever thread
  // finished it.
  void Attach(JobStream* stream, DoneCallback done);

  const v1::DecodeRequest& request() const { return request_; }
  const v1::ModelInfo& model() const { return model_; }
  const std::string& request_id() const { return request_.request_id(); }
  absl::Time received() const { return received_; }
  absl::Time deadline() const { return deadline_; }
  // Whether the call's deadline has (about) passed: a client whose deadline
  // expires cancels the call itself a little before the server's copy of
  // the deadline (which starts when the call arrives).
  bool DeadlinePassed() const;

  // ---- dispatcher side -------------------------------------------------
  // Queues `message` for the client, blocking while the buffer is full.
  // False when the call is over (cancelled, or already finished): stop.
  bool Push(v1::DecodeResponse message);
  // Ends the call with `status` once the buffered messages are written (an
  // error drops them). Only the first Finish or Cancel decides the status.
  void Finish(absl::Status status);
  // `hook` runs (under the Job's lock, so it must not block or call back into
  // this Job) when the call is cancelled. False, and nothing stored, when it
  // already is over. One hook at a time; ClearCancelHook before whatever the
  // hook touches goes away.
  bool SetCancelHook(std::function<void()> hook);
  void ClearCancelHook();
  // True once cancelled or finished.
  bool over() const;
  void UpdateReport(const std::function<void(JobReport&)>& update);
  JobReport report() const;

  // Pending = queued and not yet taken by a group (Triton's pending count).
  // MarkPending before the job is queued; TakePending is true exactly once
  // afterwards, for whoever ends the pending time first (dispatch or finish).
  void MarkPending() { pending_.store(true); }
  bool TakePending() const { return pending_.exchange(false); }

  // ---- reactor side (gRPC threads) ---------------------------------------
  void OnWriteDone(bool ok);
  // The client went away or the deadline passed: drop buffered messages,
  // run the cancel hook, finish with `reason` as soon as no write is in
  // flight.
  void Cancel(absl::Status reason);

 private:
  mutable std::atomic<bool> pending_{false};
  enum class Action { kNone, kWrite, kFinish };
  // Decides the next stream operation; the caller performs it after
  // unlocking.
  Action NextActionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(Action action) ABSL_LOCKS_EXCLUDED(mu_);

  const v1::DecodeRequest request_;
  const v1::ModelInfo model_;
  const absl::Time received_;
  const absl::Time deadline_;
  const size_t max_buffered_;
  JobStream* stream_ = nullptr;  // set by Attach
  DoneCallback done_;            // set by Attach

  mutable absl::Mutex mu_;
  std::deque<v1::DecodeResponse> buffer_ ABSL_GUARDED_BY(mu_);
  // The message being written; untouched while write_in_flight_.
  v1::DecodeResponse current_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> cancel_hook_ ABSL_GUARDED_BY(mu_);
  JobReport report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vaedecode::server
