// WorkerGroup's dispatcher (worker_group.h): takes jobs from the scheduler,
// chooses each one's mode from the group's free memory, forwards it to the
// leader and the leader's stream into the job, and finishes the job. The
// supervisor is in worker_group.cc.

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "rpc/leader_call.h"
#include "rpc/log_field.h"
#include "rpc/status.h"
#include "server/mode_selection.h"
#include "server/worker_group.h"
#include "server/worker_group_internal.h"

namespace vaedecode::server {
namespace {

using worker_group_internal::kExplainWindow;
using worker_group_internal::Ms;
using worker_group_internal::SetDeadline;

constexpr absl::Duration kStatusDeadline = absl::Seconds(2);
// How often a job that fits no memory asks the group again.
constexpr absl::Duration kMemoryPoll = absl::Milliseconds(250);
// How long the dispatcher waits for the leader to stop a cancelled job.
constexpr absl::Duration kIdleWait = absl::Seconds(30);

}  // namespace

void WorkerGroup::DispatcherLoop() {
  const auto can_run = [this](const Job& job) {
    return catalog_.GroupServes(options_.name, job.model().name());
  };
  while (true) {
    std::shared_ptr<Leader> leader;
    {
      absl::MutexLock lock(&mu_);
      const auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || state_ == State::kReady;
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
      if (stopping_) return;
      if (state_ != State::kReady) continue;
      leader = leader_;
    }
    std::shared_ptr<Job> job = scheduler_.Next(can_run, absl::Milliseconds(200));
    if (!job) continue;
    bool current;
    {
      absl::MutexLock lock(&mu_);
      current = state_ == State::kReady && leader_ == leader && !stopping_;
      busy_ = current;
    }
    if (!current) {  // the group broke meanwhile: the job was not started
      if (!scheduler_.Requeue(job)) {
        job->Finish(absl::UnavailableError("the server is shutting down"));
      }
      continue;
    }
    RunJob(leader, job);
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

std::string WorkerGroup::ReportFailure(const std::shared_ptr<Leader>& leader,
                                       const std::string& message) {
  absl::MutexLock lock(&mu_);
  if (leader->reported_failure.empty()) leader->reported_failure = message;
  const auto settled = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !leader->broken_reason.empty() || stopping_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), kExplainWindow + absl::Seconds(1));
  return leader->broken_reason.empty() ? message : leader->broken_reason;
}

std::string WorkerGroup::WaitBroken(const std::shared_ptr<Leader>& leader, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto settled = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !leader->broken_reason.empty() || stopping_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  return leader->broken_reason;
}

void WorkerGroup::RefreshMemory(const std::shared_ptr<Leader>& leader) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Now() + kStatusDeadline);
  internal::StatusResponse status;
  if (!leader->stub->Status(&ctx, internal::StatusRequest(), &status).ok()) return;
  // Ranks report what they can measure; missing figures leave the gauges as they are.
  for (size_t r = 0; r < options_.devices.size(); ++r) {
    if (r < static_cast<size_t>(status.free_bytes_per_rank_size())) {
      metrics_.SetDeviceFreeBytes(options_.name, options_.devices[r],
                                  status.free_bytes_per_rank(r));
    }
    if (r < static_cast<size_t>(status.peak_bytes_per_rank_size())) {
      metrics_.SetDevicePeakBytes(options_.name, options_.devices[r],
                                  status.peak_bytes_per_rank(r));
    }
  }
}

void WorkerGroup::RunJob(const std::shared_ptr<Leader>& leader, const std::shared_ptr<Job>& job) {
  const double queue_ms = Ms(absl::Now() - job->received());
  job->UpdateReport([&](JobReport& r) {
    r.group = options_.name;
    r.timings.set_queue_ms(queue_ms);
  });
  const std::optional<ModeChoice> choice = ChooseMode(leader, job);
  if (!choice) return;  // finished or requeued meanwhile

  // The request goes as the client sent it (serialised from the job's own
  // copy, never copied again); the scheduler's choice rides in the metadata.
  grpc::ClientContext ctx;
  SetDeadline(ctx, job->deadline());
  ctx.AddMetadata(rpc::kMaxChunkBytesKey, absl::StrCat(options_.max_chunk_bytes));
  ctx.AddMetadata(rpc::kDecodeModeKey, absl::StrCat(static_cast<int>(choice->mode)));
  bool current;
  {
    absl::MutexLock lock(&mu_);
    current = state_ == State::kReady && leader_ == leader;
    if (current) running_ = &ctx;
  }
  if (!current) {
    if (!scheduler_.Requeue(job)) job->Finish(absl::UnavailableError("the server is stopping"));
    return;
  }
  const auto unregister = [&] {
    absl::MutexLock lock(&mu_);
    running_ = nullptr;
  };
  if (!job->SetCancelHook([&ctx] { ctx.TryCancel(); })) {
    unregister();  // cancelled while we prepared: it finishes itself
    return;
  }
  // Pending until it runs: a job waiting here for memory, or requeued
  // after its group failed, still counts as pending (and its queue time
  // once, when it finally runs).
  if (job->TakePending()) {
    metrics_.AddPending(job->model().name(), -1);
    metrics_.RecordQueueTime(queue_ms / 1000);
  }
  metrics_.AddInFlight(1);
  const LeaderStream stream = ForwardStream(leader, ctx, job, queue_ms);
  job->ClearCancelHook();
  unregister();
  metrics_.AddInFlight(-1);
  {
    absl::MutexLock lock(&mu_);
    leader_may_be_busy_ = false;
  }
  if (stream.client_gone || job->over()) {  // cancelled: the job finishes itself
    AwaitLeaderIdle(leader, *job);
    return;
  }
  Conclude(leader, job, stream);
}

std::optional<ModeChoice> WorkerGroup::ChooseMode(const std::shared_ptr<Leader>& leader,
                                                  const std::shared_ptr<Job>& job) {
  // The group's resources, for the mode choice; asked again while nothing
  // fits the group's free memory, until the request's deadline.
  bool waiting_for_memory = false;
  const auto stop_waiting = [&] {
    if (waiting_for_memory) metrics_.AddMemoryWaits(-1);
    waiting_for_memory = false;
  };
  while (true) {
    GroupResources resources;
    resources.degree = static_cast<int>(options_.devices.size());
    grpc::ClientContext ctx;
    SetDeadline(ctx, std::min(job->deadline(), absl::Now() + kStatusDeadline));
    internal::StatusResponse status;
    const grpc::Status s = leader->stub->Status(&ctx, internal::StatusRequest(), &status);
    if (s.ok()) {
      resources.free_bytes_per_rank.assign(status.free_bytes_per_rank().begin(),
                                           status.free_bytes_per_rank().end());
      resources.capacity_bytes_per_rank.assign(status.capacity_bytes_per_rank().begin(),
                                               status.capacity_bytes_per_rank().end());
    } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // The leader may be gone. If the supervisor confirms it, the job (not
      // started yet) goes back to the head of the queue for the rebuilt
      // group or another one; otherwise it runs without memory figures.
      const std::string reason = WaitBroken(leader, kExplainWindow + absl::Milliseconds(200));
      if (!reason.empty()) {
        spdlog::warn("group={} event=requeue request_id={} reason={}", options_.name,
                     rpc::LogValue(job->request_id()), rpc::LogValue(reason));
        stop_waiting();
        if (!scheduler_.Requeue(job)) {
          job->Finish(
              absl::UnavailableError(absl::StrCat("worker group ", options_.name, " failed (",
                                                  reason, ") and the server is stopping")));
        }
        return std::nullopt;
      }
    }
    absl::StatusOr<ModeChoice> choice = SelectMode(job->request(), job->model(), resources);
    if (!choice.ok()) {
      stop_waiting();
      job->Finish(choice.status());
      return std::nullopt;
    }
    if (!choice->wait_for_memory) {
      stop_waiting();
      return *choice;
    }
    if (!waiting_for_memory) metrics_.AddMemoryWaits(1);
    waiting_for_memory = true;
    if (absl::Now() + kMemoryPoll >= job->deadline()) {
      stop_waiting();
      job->Finish(absl::DeadlineExceededError(
          absl::StrCat("deadline exceeded while waiting for memory: ", choice->reason)));
      return std::nullopt;
    }
    // The wait holds the group: it ends with the caller (cancelled: the job
    // finished itself) and with the server.
    if (!SleepUnlessStopping(kMemoryPoll)) {
      stop_waiting();
      job->Finish(absl::UnavailableError(
          absl::StrCat("the server is stopping; the request was waiting for memory: ", choice->reason)));
      return std::nullopt;
    }
    if (job->over()) {
      stop_waiting();
      return std::nullopt;
    }
  }
}

WorkerGroup::LeaderStream WorkerGroup::ForwardStream(const std::shared_ptr<Leader>& leader,
                                                     grpc::ClientContext& ctx, const std::shared_ptr<Job>& job,
                                                     double queue_ms) {
  LeaderStream stream;
  absl::Time first_message = absl::InfiniteFuture();
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader = leader->stub->Run(&ctx, job->request());
  v1::DecodeResponse message;
  while (reader->Read(&message)) {
    if (stream.client_gone) continue;  // drain after TryCancel
    const absl::Time now = absl::Now();
    if (first_message == absl::InfiniteFuture()) first_message = now;
    if (message.has_header()) {
      stream.got_header = true;
      const v1::Header& h = message.header();
      job->UpdateReport([&](JobReport& r) {
        r.mode = ModeName(h.mode());
        r.mode_reason = h.mode_reason();
        r.degree = h.degree();
        r.output_shape.assign(h.shape().begin(), h.shape().end());
      });
    } else if (message.has_trailer()) {
      stream.got_trailer = true;
      v1::Timings* t = message.mutable_trailer()->mutable_timings();
      t->set_queue_ms(queue_ms);
      t->set_stream_ms(Ms(now - first_message));
      t->set_total_ms(Ms(now - job->received()));
      const v1::Trailer trailer = message.trailer();
      job->UpdateReport([&](JobReport& r) {
        r.timings = trailer.timings();
        r.collectives = trailer.collectives();
        r.tile_retries = trailer.tile_retries();
        r.peak_bytes_per_rank.assign(trailer.peak_bytes_per_rank().begin(),
                                     trailer.peak_bytes_per_rank().end());
        r.collective_wait_ms_per_rank.assign(trailer.collective_wait_ms_per_rank().begin(),
                                             trailer.collective_wait_ms_per_rank().end());
        r.decoded = true;
      });
    } else if (!stream.got_header) {
      continue;  // a chunk before the header is a leader bug: dropped, caught in Conclude
    }
    if (!job->Push(std::move(message))) {
      stream.client_gone = true;
      ctx.TryCancel();
    }
    message.Clear();
  }
  stream.finished = reader->Finish();
  return stream;
}

void WorkerGroup::AwaitLeaderIdle(const std::shared_ptr<Leader>& leader, const Job& job) {
  // The call ends at once, but the leader stops at its next op: wait for
  // it, so that the group's next request does not start on a busy leader
  // (whose wait would show in no timing field), and measure the release.
  grpc::ClientContext idle_ctx;
  SetDeadline(idle_ctx, absl::Now() + kIdleWait + kStatusDeadline);
  internal::StatusRequest wait;
  wait.set_wait_idle_ms(absl::ToInt64Milliseconds(kIdleWait));
  internal::StatusResponse idle;
  const bool answered = leader->stub->Status(&idle_ctx, wait, &idle).ok();
  {
    absl::MutexLock lock(&mu_);
    leader_may_be_busy_ = !(answered && idle.idle());
  }
  const absl::Time cancelled = job.cancelled_at();
  if (cancelled < absl::InfiniteFuture()) {
    const absl::Duration release = absl::Now() - cancelled;
    metrics_.RecordCancelRelease(absl::ToDoubleSeconds(release));
    spdlog::debug("group={} event=released_after_cancel request_id={} release_ms={:.1f} leader_idle={}",
                  options_.name, rpc::LogValue(job.request_id()), Ms(release), answered && idle.idle());
  }
}

void WorkerGroup::Conclude(const std::shared_ptr<Leader>& leader, const std::shared_ptr<Job>& job,
                           const LeaderStream& stream) {
  std::string broken;
  {
    absl::MutexLock lock(&mu_);
    broken = leader->broken_reason;
  }
  if (!broken.empty()) {
    job->Finish(absl::UnavailableError(absl::StrCat("worker group ", options_.name,
                                                    " failed during the decode: ", broken,
                                                    "; the group is being rebuilt, retry")));
    return;
  }
  if (!stream.finished.ok()) {
    const absl::Status s = rpc::FromGrpcStatus(stream.finished);
    if (absl::IsUnavailable(s)) {
      // The leader died, or reported that its communicator failed.
      const std::string reason = ReportFailure(leader, std::string(s.message()));
      job->Finish(absl::UnavailableError(absl::StrCat("worker group ", options_.name,
                                                      " failed during the decode: ", reason,
                                                      "; the group is being rebuilt, retry")));
      return;
    }
    job->Finish(s);
    return;
  }
  if (!stream.got_header || !stream.got_trailer) {
    job->Finish(absl::InternalError(absl::StrCat("worker group ", options_.name,
                                                 ": the leader's stream ended without a ",
                                                 stream.got_header ? "trailer" : "header")));
    return;
  }
  const JobReport report = job->report();
  double most_waited_ms = 0;  // the rank that waited longest in collectives
  for (double ms : report.collective_wait_ms_per_rank) most_waited_ms = std::max(most_waited_ms, ms);
  metrics_.RecordDecode(job->model().name(), job->model().family(), report.mode, report.degree,
                        report.timings.decode_ms() / 1000, report.timings.gather_ms() / 1000,
                        report.collectives, most_waited_ms / 1000);
  metrics_.RecordStreamTime(report.timings.stream_ms() / 1000);
  if (report.tile_retries > 0) metrics_.RecordTileRetries(job->model().name(), report.tile_retries);
  job->Finish(absl::OkStatus());
  RefreshMemory(leader);
}

}  // namespace vaedecode::server
