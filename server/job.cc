#include "server/job.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace vaedecode::server {

bool OutputBudget::Acquire(int64_t bytes, const std::function<bool()>& give_up) {
  constexpr absl::Duration kPoll = absl::Milliseconds(50);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const auto room = [this, bytes]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return used_ == 0 || used_ + bytes <= limit_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&room), kPoll)) {
        used_ += bytes;
        return true;
      }
    }
    if (give_up()) return false;
  }
}

void OutputBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
}

int64_t OutputBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

Job::Job(v1::DecodeRequest request, v1::ModelInfo model, absl::Time received, absl::Time deadline,
         JobBuffering buffering)
    : request_(std::move(request)),
      model_(std::move(model)),
      received_(received),
      deadline_(deadline),
      buffering_(buffering) {}

Job::Job(v1::DecodeRequest envelope, v1::EncodeRequest encode, v1::ModelInfo model, absl::Time received,
         absl::Time deadline, JobBuffering buffering)
    : request_(std::move(envelope)),
      encode_(std::make_unique<const v1::EncodeRequest>(std::move(encode))),
      model_(std::move(model)),
      received_(received),
      deadline_(deadline),
      buffering_(buffering) {}

void Job::SetSession(std::shared_ptr<SessionRecord> session, SessionPart part) {
  session_ = std::move(session);
  session_part_ = part;
}

void Job::Attach(JobStream* stream, DoneCallback done) {
  stream_ = stream;
  done_ = std::move(done);
}

bool Job::Push(v1::DecodeResponse message) {
  const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong());
  {
    absl::MutexLock lock(&mu_);
    const auto room = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || finish_requested_ || buffer_bytes_ == 0 ||
             buffer_bytes_ + bytes <= buffering_.max_call_bytes;
    };
    mu_.Await(absl::Condition(&room));
    if (cancelled_ || finish_requested_) return false;
  }
  if (buffering_.budget != nullptr && !buffering_.budget->Acquire(bytes, [this] { return over(); })) {
    return false;
  }
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finish_requested_) {
      if (buffering_.budget != nullptr) buffering_.budget->Release(bytes);
      return false;
    }
    buffer_.emplace_back(std::move(message), bytes);
    buffer_bytes_ += bytes;
    action = NextActionLocked();
  }
  Perform(action);
  return true;
}

void Job::DropBufferLocked() {
  if (buffering_.budget != nullptr) buffering_.budget->Release(buffer_bytes_);
  buffer_.clear();
  buffer_bytes_ = 0;
}

void Job::Finish(absl::Status status) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finish_requested_) return;
    finish_requested_ = true;
    final_status_ = std::move(status);
    if (!final_status_.ok()) DropBufferLocked();
    cancel_hook_ = nullptr;
    action = NextActionLocked();
  }
  Perform(action);
}

bool Job::SetCancelHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  if (cancelled_ || finish_requested_) return false;
  cancel_hook_ = std::move(hook);
  return true;
}

void Job::ClearCancelHook() {
  absl::MutexLock lock(&mu_);
  cancel_hook_ = nullptr;
}

absl::Time Job::cancelled_at() const {
  absl::MutexLock lock(&mu_);
  return cancelled_at_;
}

bool Job::over() const {
  absl::MutexLock lock(&mu_);
  return cancelled_ || finish_requested_;
}

void Job::UpdateReport(const std::function<void(JobReport&)>& update) {
  absl::MutexLock lock(&mu_);
  update(report_);
}

JobReport Job::report() const {
  absl::MutexLock lock(&mu_);
  return report_;
}

bool Job::DeadlinePassed() const {
  constexpr absl::Duration kDeadlineSkew = absl::Milliseconds(200);
  return absl::Now() + kDeadlineSkew >= deadline_;
}

void Job::OnWriteDone(bool ok) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    write_wait_total_ += absl::Now() - write_started_;
    if (buffering_.budget != nullptr) buffering_.budget->Release(current_bytes_);
    current_bytes_ = 0;
    current_.Clear();
    if (!ok && !cancelled_) {
      // The stream broke under the write: the client is gone.
      cancelled_ = true;
      cancelled_at_ = absl::Now();
      DropBufferLocked();
      if (!finish_requested_ || final_status_.ok()) {
        final_status_ = DeadlinePassed()
                            ? absl::DeadlineExceededError(absl::StrCat("deadline exceeded after ",
                                                                       absl::FormatDuration(absl::Now() - received_)))
                            : absl::CancelledError("the client stream closed");
      }
      if (cancel_hook_) {
        cancel_hook_();
        cancel_hook_ = nullptr;
      }
    }
    action = NextActionLocked();
  }
  Perform(action);
}

void Job::Cancel(absl::Status reason) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finish_called_) return;
    cancelled_ = true;
    cancelled_at_ = absl::Now();
    DropBufferLocked();
    if (!finish_requested_ || final_status_.ok()) final_status_ = std::move(reason);
    if (cancel_hook_) {
      cancel_hook_();
      cancel_hook_ = nullptr;
    }
    action = NextActionLocked();
  }
  Perform(action);
}

absl::Duration Job::WriteStalledFor(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  // A cancelled call is ending already: not stalled (and not counted twice).
  return write_in_flight_ && !finish_called_ && !cancelled_ ? now - write_started_ : absl::ZeroDuration();
}

absl::Duration Job::WriteWaitTotal(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (finish_called_ || cancelled_) return absl::ZeroDuration();  // ending already
  return write_wait_total_ + (write_in_flight_ ? now - write_started_ : absl::ZeroDuration());
}

void Job::AbortStalled(absl::Status reason) {
  Cancel(std::move(reason));
  {
    absl::MutexLock lock(&mu_);
    if (finish_called_) return;  // the stream may be gone already
    aborting_ = true;            // keeps it alive: Finish waits until Abort returns
  }
  // Outside the lock: the cancellation may complete the write (OnWriteDone) at once.
  stream_->Abort();
  Action action = Action::kNone;
  {
    absl::MutexLock lock(&mu_);
    aborting_ = false;
    if (finish_deferred_) {
      finish_deferred_ = false;
      action = NextActionLocked();
    }
  }
  Perform(action);
}

Job::Action Job::NextActionLocked() {
  if (finish_called_ || write_in_flight_) return Action::kNone;
  if (!cancelled_ && !buffer_.empty()) {
    current_ = std::move(buffer_.front().first);
    current_bytes_ = buffer_.front().second;
    buffer_bytes_ -= current_bytes_;
    buffer_.pop_front();
    write_in_flight_ = true;
    write_started_ = absl::Now();
    return Action::kWrite;
  }
  if (cancelled_ || finish_requested_) {
    if (aborting_) {  // AbortStalled finishes once its Abort has returned
      finish_deferred_ = true;
      return Action::kNone;
    }
    finish_called_ = true;
    return Action::kFinish;
  }
  return Action::kNone;
}

void Job::Perform(Action action) {
  switch (action) {
    case Action::kNone:
      return;
    case Action::kWrite:
      // current_ is not touched again until OnWriteDone.
      stream_->StartWrite(&current_);
      return;
    case Action::kFinish: {
      absl::Status status;
      {
        absl::MutexLock lock(&mu_);
        status = final_status_;
      }
      // Whatever the stream's Finish or the done callback releases, this
      // Job lives until both have returned.
      const std::shared_ptr<Job> keep = weak_from_this().lock();
      // After Finish the stream may be destroyed at any moment: not touched again.
      stream_->Finish(status);
      if (done_) done_(*this, status);
      return;
    }
  }
}

}  // namespace vaedecode::server
