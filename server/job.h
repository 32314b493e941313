#pragma once

// One Decode call as the scheduler and the worker groups see it: the request,
// the model it was validated against, and the client stream's buffer.
//
// Ownership: a Job is shared (std::shared_ptr) by the call's reactor (until
// gRPC's OnDone) or unary caller, the scheduler's queue (while queued) and
// the dispatcher thread of the group running it. The stream it writes to is
// owned by gRPC (or, for the unary protocols, kept alive by the Job's done
// callback); the Job calls it only until it has called Finish on it, and it
// is destroyed only after that, so the raw pointer stays valid for every use.
//
// Threading: the "dispatcher side" is called by one thread at a time (the
// group dispatcher that took the job, or the scheduler failing a queued
// job); the "reactor side" by gRPC's callback threads. Push may block the
// dispatcher (bounded buffer: back-pressure reaches the leader's stream);
// nothing on the reactor side blocks. The output a group has finished
// waits here (bounded per call and by the shared OutputBudget), so the group
// is free as soon as its decode is done, however slowly the client reads. gRPC operations on the stream are
// always started outside the Job's lock. Lock order: Job, then the
// scheduler (a queued job's cancel hook removes it from the queue).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/session_record.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// The client side of a call as a Job sees it: implemented by the Decode
// reactor (forwarding to grpc::ServerWriteReactor), by the collecting stream
// of the unary protocols (server/collected_decode.cc: HTTP, OIP), or by a
// fake in tests.
// The Job keeps at most one StartWrite outstanding, reports its completion
// through Job::OnWriteDone, and calls Finish once, last.
class JobStream {
 public:
  virtual ~JobStream() = default;
  virtual void StartWrite(const v1::DecodeResponse* message) = 0;
  virtual void Finish(const absl::Status& status) = 0;
  // Cancels the call on the transport, so a write that cannot complete (the
  // client stopped reading) completes as failed. May be called at any time.
  virtual void Abort() = 0;
};

// Bytes of finished output waiting in the server for slow clients, across
// all calls. A group hands its output to the Job and is free for the next
// request; this bounds what those outputs may hold. Thread-safe.
class OutputBudget {
 public:
  explicit OutputBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  // Reserves `bytes`, waiting while that would pass the limit (a reservation
  // larger than the limit waits until nothing else is held). Polls `give_up`
  // (called without the budget's lock); false, and nothing reserved, once it
  // says so.
  bool Acquire(int64_t bytes, const std::function<bool()>& give_up);
  void Release(int64_t bytes);
  int64_t used() const;
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// How much output one Job may hold for its client.
struct JobBuffering {
  // Messages queued behind the write in flight may hold this many bytes
  // (one message always may); beyond it Push waits for the client.
  int64_t max_call_bytes = 64 << 20;
  OutputBudget* budget = nullptr;  // shared by all jobs; nullptr: unbounded
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
  std::vector<double> collective_wait_ms_per_rank;
  bool decoded = false;  // the leader sent its trailer
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  using DoneCallback = std::function<void(const Job& job, const absl::Status& status)>;

  // `model` is the description the request was validated against; `deadline`
  // is the call's (absl::InfiniteFuture() when none); `buffering` bounds the
  // output waiting for the client stream.
  Job(v1::DecodeRequest request, v1::ModelInfo model, absl::Time received, absl::Time deadline, JobBuffering buffering);
  // An encode: `envelope` holds its routing fields (model, request_id, mode,
  // OUTPUT_FLOAT32), which the scheduler and the logs read as a decode's;
  // the leader runs `encode`.
  Job(v1::DecodeRequest envelope, v1::EncodeRequest encode, v1::ModelInfo model, absl::Time received,
      absl::Time deadline, JobBuffering buffering);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // What a streaming session's job is.
  enum class SessionPart {
    kChunk,      // a chunk of the clip (the request holds its latent)
    kLastChunk,  // the clip's last chunk (SessionRequest.last_chunk)
    kClose,      // the group frees the session's state
  };
  // A streaming session's job (before the job is shared); it runs only on
  // the session's group.
  void SetSession(std::shared_ptr<SessionRecord> session, SessionPart part);
  // The session this job belongs to; nullptr for a Decode or Encode.
  const std::shared_ptr<SessionRecord>& session() const { return session_; }
  bool session_close() const { return session_part_ == SessionPart::kClose; }
  bool session_last_chunk() const { return session_part_ == SessionPart::kLastChunk; }
  // How often the job went back to the queue after its group failed under
  // it (a session's chunk is retried on the rebuilt group); dispatcher side.
  int retries() const { return retries_.load(); }
  void AddRetry() { retries_.fetch_add(1); }

  // Binds the client stream; once, before the job is shared. `done` runs
  // exactly once, right after the stream is finished, on whichever thread
  // finished it.
  void Attach(JobStream* stream, DoneCallback done);

  const v1::DecodeRequest& request() const { return request_; }
  // The encode this job runs; nullptr for a decode.
  const v1::EncodeRequest* encode() const { return encode_.get(); }
  const v1::ModelInfo& model() const { return model_; }
  const std::string& request_id() const { return request_.request_id(); }
  absl::Time received() const { return received_; }
  absl::Time deadline() const { return deadline_; }
  // Whether the call's deadline has (about) passed: a client whose deadline
  // expires cancels the call itself a little before the server's copy of
  // the deadline (which starts when the call arrives).
  bool DeadlinePassed() const;

  // ---- dispatcher side -------------------------------------------------
  // Queues `message` for the client, blocking while the call's buffer or
  // the shared budget is full (a stalled client is cancelled by the stall
  // watch, which unblocks this). False when the call is over (cancelled, or
  // already finished): stop.
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
  // When the call was cancelled (client, deadline, stall); InfiniteFuture if not.
  absl::Time cancelled_at() const;
  void UpdateReport(const std::function<void(JobReport&)>& update);
  JobReport report() const;

  // Pending = queued and not yet taken by a group (Triton's pending count).
  // MarkPending before the job is queued; TakePending is true exactly once
  // afterwards, for whoever ends the pending time first (dispatch or finish).
  void MarkPending() { pending_.store(true); }
  bool TakePending() const { return pending_.exchange(false); }

  // ---- stall watch (any thread) -----------------------------------------
  // How long the write in flight has been waiting for the client to read
  // (zero when none is).
  absl::Duration WriteStalledFor(absl::Time now) const;
  // How long the call's writes have waited for the client in all (each
  // write's wait, summed, the one in flight included): a reader slow enough
  // never to stall a write past the stall timeout still adds up here.
  absl::Duration WriteWaitTotal(absl::Time now) const;
  // Cancels the call with `reason` and aborts its stream, so the stuck write
  // fails and the call ends.
  void AbortStalled(absl::Status reason);

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
  // Empties the buffer, returning its bytes to the budget.
  void DropBufferLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::DecodeRequest request_;
  const std::unique_ptr<const v1::EncodeRequest> encode_;
  const v1::ModelInfo model_;
  const absl::Time received_;
  const absl::Time deadline_;
  const JobBuffering buffering_;
  std::shared_ptr<SessionRecord> session_;  // set by SetSession
  SessionPart session_part_ = SessionPart::kChunk;
  std::atomic<int> retries_{0};
  JobStream* stream_ = nullptr;  // set by Attach
  DoneCallback done_;            // set by Attach

  mutable absl::Mutex mu_;
  // Queued messages with their sizes (reserved in the budget).
  std::deque<std::pair<v1::DecodeResponse, int64_t>> buffer_ ABSL_GUARDED_BY(mu_);
  int64_t buffer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The message being written; untouched while write_in_flight_.
  v1::DecodeResponse current_ ABSL_GUARDED_BY(mu_);
  int64_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  absl::Duration write_wait_total_ ABSL_GUARDED_BY(mu_);  // finished writes' waits
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time cancelled_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  // AbortStalled is calling stream_->Abort(): the stream must outlive it.
  bool aborting_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_deferred_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> cancel_hook_ ABSL_GUARDED_BY(mu_);
  JobReport report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vaedecode::server
