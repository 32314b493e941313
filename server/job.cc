#include "server/job.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace vaedecode::server {

Job::Job(v1::DecodeRequest request, v1::ModelInfo model, absl::Time received, absl::Time deadline,
         size_t max_buffered)
    : request_(std::move(request)),
      model_(std::move(model)),
      received_(received),
      deadline_(deadline),
      max_buffered_(max_buffered < 1 ? 1 : max_buffered) {}

void Job::Attach(JobStream* stream, DoneCallback done) {
  stream_ = stream;
  done_ = std::move(done);
}

bool Job::Push(v1::DecodeResponse message) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || finish_requested_ || buffer_.size() < max_buffered_;
    };
    mu_.Await(absl::Condition(&ready));
    if (cancelled_ || finish_requested_) return false;
    buffer_.push_back(std::move(message));
    action = NextActionLocked();
  }
  Perform(action);
  return true;
}

void Job::Finish(absl::Status status) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || finish_requested_) return;
    finish_requested_ = true;
    final_status_ = std::move(status);
    if (!final_status_.ok()) buffer_.clear();
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
    if (!ok && !cancelled_) {
      // The stream broke under the write: the client is gone.
      cancelled_ = true;
      buffer_.clear();
      if (!finish_requested_ || final_status_.ok()) {
        final_status_ = DeadlinePassed()
                            ? absl::DeadlineExceededError(absl::StrCat(
                                  "deadline exceeded after ", absl::FormatDuration(absl::Now() - received_)))
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
    buffer_.clear();
    if (!finish_requested_ || final_status_.ok()) final_status_ = std::move(reason);
    if (cancel_hook_) {
      cancel_hook_();
      cancel_hook_ = nullptr;
    }
    action = NextActionLocked();
  }
  Perform(action);
}

Job::Action Job::NextActionLocked() {
  if (finish_called_ || write_in_flight_) return Action::kNone;
  if (!cancelled_ && !buffer_.empty()) {
    current_ = std::move(buffer_.front());
    buffer_.pop_front();
    write_in_flight_ = true;
    return Action::kWrite;
  }
  if (cancelled_ || finish_requested_) {
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
      // After Finish the stream may be destroyed at any moment: not touched again.
      stream_->Finish(status);
      if (done_) done_(*this, status);
      return;
    }
  }
}

}  // namespace vaedecode::server
