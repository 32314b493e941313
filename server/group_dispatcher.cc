// GroupDispatcher (server/group_dispatcher.h): takes jobs from the
// scheduler, chooses each one's mode from the group's free memory, runs it
// on the leader and forwards the leader's stream into the job.

#include "server/group_dispatcher.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "rpc/log_field.h"
#include "rpc/modes.h"
#include "rpc/status.h"
#include "server/mode_selection.h"

namespace vaedecode::server {
namespace {

using worker_group_internal::kExplainWindow;
using worker_group_internal::Ms;
using worker_group_internal::SetDeadline;

constexpr absl::Duration kStatusDeadline = absl::Seconds(2);
// How often a job that fits no memory asks the group again.
constexpr absl::Duration kMemoryPoll = absl::Milliseconds(250);
// How long a leader may take to stop a cancelled job before its group goes
// out of rotation: most stop within tens of ms, an exact decode within a
// band's convolution (seconds on a loaded CPU); readiness should not flap.
constexpr absl::Duration kReleaseGrace = absl::Seconds(5);
// How often a session's chunk is retried after its group failed under it.
constexpr int kSessionChunkRetries = 2;

}  // namespace

void GroupDispatcher::Run() {
  const auto can_run = [this](const Job& job) {
    if (job.session() != nullptr && job.session()->group() != g_.options.name) return false;
    return job.session_close() || g_.catalog.GroupServes(g_.options.name, job.model().name());
  };
  while (true) {
    std::shared_ptr<LeaderConnection> leader;
    {
      absl::MutexLock lock(&g_.mu);
      const auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_.mu) {
        return g_.stopping || g_.phase == GroupState::Phase::kReady;
      };
      g_.mu.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
      if (g_.stopping) return;
      if (g_.phase != GroupState::Phase::kReady) continue;
      leader = g_.leader;
    }
    std::shared_ptr<Job> job = g_.scheduler.Next(can_run, absl::Milliseconds(200));
    if (!job) continue;
    bool current;
    {
      absl::MutexLock lock(&g_.mu);
      current = g_.phase == GroupState::Phase::kReady && g_.leader == leader && !g_.stopping;
      g_.busy = current;
    }
    if (!current) {  // the group broke meanwhile: the job was not started
      if (!g_.scheduler.Requeue(job)) {
        job->Finish(absl::UnavailableError("the server is shutting down"));
      }
      continue;
    }
    RunJob(leader, job);
    absl::MutexLock lock(&g_.mu);
    g_.busy = false;
  }
}

std::string GroupDispatcher::ReportFailure(const std::shared_ptr<LeaderConnection>& leader,
                                           const std::string& message) {
  absl::MutexLock lock(&g_.mu);
  if (leader->reported_failure.empty()) leader->reported_failure = message;
  const auto settled = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_.mu) {
    return !leader->broken_reason.empty() || g_.stopping;
  };
  g_.mu.AwaitWithTimeout(absl::Condition(&settled), kExplainWindow + absl::Seconds(1));
  return leader->broken_reason.empty() ? message : leader->broken_reason;
}

std::string GroupDispatcher::WaitBroken(const std::shared_ptr<LeaderConnection>& leader, absl::Duration timeout) {
  absl::MutexLock lock(&g_.mu);
  const auto settled = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_.mu) {
    return !leader->broken_reason.empty() || g_.stopping;
  };
  g_.mu.AwaitWithTimeout(absl::Condition(&settled), timeout);
  return leader->broken_reason;
}

void GroupDispatcher::CloseSession(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Now() + kStatusDeadline + g_.options.cancel_release_timeout);
  internal::CloseSessionRequest request;
  request.set_id(job->session()->id());
  internal::CloseSessionResponse response;
  const grpc::Status s = leader->stub->CloseSession(&ctx, request, &response);
  // A group that failed meanwhile lost the state with its workers.
  job->Finish(s.ok() || s.error_code() == grpc::StatusCode::UNAVAILABLE ? absl::OkStatus() : rpc::FromGrpcStatus(s));
  g_.RefreshMemory(*leader);
}

bool GroupDispatcher::RetrySessionChunk(const std::shared_ptr<Job>& job, const std::string& why) {
  if (job->session() == nullptr) return false;
  job->session()->StateLost();
  if (job->retries() >= kSessionChunkRetries) return false;
  job->AddRetry();
  spdlog::info("group={} event=session_chunk_retry session={} request_id={} retry={} reason={}", g_.options.name,
               rpc::LogValue(job->session()->public_id()), rpc::LogValue(job->request_id()), job->retries(),
               rpc::LogValue(why));
  return g_.scheduler.Requeue(job);
}

void GroupDispatcher::RunJob(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job) {
  if (job->session_close()) return CloseSession(leader, job);
  const double queue_ms = Ms(absl::Now() - job->received());
  job->UpdateReport([&](JobReport& r) {
    r.group = g_.options.name;
    r.timings.set_queue_ms(queue_ms);
  });
  const std::optional<ModeChoice> choice = ChooseMode(leader, job);
  if (!choice) return;  // finished or requeued meanwhile
  // A session's chunk continues the state this leader holds, or rebuilds it.
  std::optional<internal::SessionStep> session;
  if (job->session() != nullptr) {
    absl::StatusOr<internal::SessionStep> step = job->session()->StepOn(leader->incarnation);
    if (!step.ok()) return job->Finish(step.status());
    session = *std::move(step);
    session->set_ends(job->session_last_chunk());
  }

  grpc::ClientContext ctx;
  SetDeadline(ctx, job->deadline());
  bool current;
  {
    absl::MutexLock lock(&g_.mu);
    current = g_.phase == GroupState::Phase::kReady && g_.leader == leader;
    if (current) g_.running = &ctx;
  }
  if (!current) {
    if (!g_.scheduler.Requeue(job)) job->Finish(absl::UnavailableError("the server is stopping"));
    return;
  }
  const auto unregister = [&] {
    absl::MutexLock lock(&g_.mu);
    g_.running = nullptr;
  };
  if (!job->SetCancelHook([&ctx] { ctx.TryCancel(); })) {
    unregister();  // cancelled while we prepared: it finishes itself
    return;
  }
  // Pending until it runs: a job waiting here for memory, or requeued
  // after its group failed, still counts as pending (and its queue time
  // once, when it finally runs).
  if (job->TakePending()) {
    g_.metrics.AddPending(job->model().name(), -1);
    g_.metrics.RecordQueueTime(queue_ms / 1000);
  }
  g_.metrics.AddInFlight(1);
  const LeaderStream stream = ForwardStream(leader, ctx, job, choice->mode, queue_ms, session ? &*session : nullptr);
  job->ClearCancelHook();
  unregister();
  g_.metrics.AddInFlight(-1);
  {
    absl::MutexLock lock(&g_.mu);
    g_.leader_may_be_busy = false;
  }
  if (stream.client_gone || job->over()) {                       // cancelled: the job finishes itself
    if (job->session() != nullptr) job->session()->StateLost();  // the chunk may have advanced it
    AwaitLeaderIdle(leader, *job);
    return;
  }
  Conclude(leader, job, stream);
}

std::optional<ModeChoice> GroupDispatcher::ChooseMode(const std::shared_ptr<LeaderConnection>& leader,
                                                      const std::shared_ptr<Job>& job) {
  if (job->session() != nullptr) {
    // Every chunk of a session in its mode (its state is laid out for it);
    // its memory was admitted when the session opened.
    ModeChoice choice;
    choice.mode = job->session()->mode();
    choice.reason = "the session's mode";
    return choice;
  }
  if (job->encode() != nullptr) {
    // Encodes are dense or exact as asked (AUTO: exact when the group has
    // ranks to share it); the leader falls back to dense for an image too
    // small to shard and says why. Encode memory is not modelled yet.
    const int degree = static_cast<int>(g_.options.devices.size());
    const v1::Mode asked = job->encode()->mode();
    ModeChoice choice;
    choice.mode = asked == v1::MODE_DENSE || degree < 2 ? v1::MODE_DENSE : v1::MODE_EXACT;
    choice.reason = asked == v1::MODE_AUTO ? "auto: exact over the group" : "requested";
    return choice;
  }
  // The group's resources, for the mode choice; asked again while nothing
  // fits the group's free memory, until the request's deadline.
  bool waiting_for_memory = false;
  const auto stop_waiting = [&] {
    if (waiting_for_memory) g_.metrics.AddMemoryWaits(-1);
    waiting_for_memory = false;
  };
  while (true) {
    GroupResources resources;
    resources.degree = static_cast<int>(g_.options.devices.size());
    grpc::ClientContext ctx;
    SetDeadline(ctx, std::min(job->deadline(), absl::Now() + kStatusDeadline));
    internal::StatusResponse status;
    const grpc::Status s = leader->stub->Status(&ctx, internal::StatusRequest(), &status);
    if (s.ok()) {
      resources.free_bytes_per_rank.assign(status.free_bytes_per_rank().begin(), status.free_bytes_per_rank().end());
      resources.capacity_bytes_per_rank.assign(status.capacity_bytes_per_rank().begin(),
                                               status.capacity_bytes_per_rank().end());
    } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // The leader may be gone. If the supervisor confirms it, the job (not
      // started yet) goes back to the head of the queue for the rebuilt
      // group or another one; otherwise it runs without memory figures.
      const std::string reason = WaitBroken(leader, kExplainWindow + absl::Milliseconds(200));
      if (!reason.empty()) {
        spdlog::warn("group={} event=requeue request_id={} reason={}", g_.options.name,
                     rpc::LogValue(job->request_id()), rpc::LogValue(reason));
        stop_waiting();
        if (!g_.scheduler.Requeue(job)) {
          job->Finish(absl::UnavailableError(
              absl::StrCat("worker group ", g_.options.name, " failed (", reason, ") and the server is stopping")));
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
    if (!waiting_for_memory) g_.metrics.AddMemoryWaits(1);
    waiting_for_memory = true;
    if (absl::Now() + kMemoryPoll >= job->deadline()) {
      stop_waiting();
      job->Finish(
          absl::DeadlineExceededError(absl::StrCat("deadline exceeded while waiting for memory: ", choice->reason)));
      return std::nullopt;
    }
    // The wait holds the group: it ends with the caller (cancelled: the job
    // finished itself) and with the server.
    if (!g_.SleepUnlessStopping(kMemoryPoll)) {
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

GroupDispatcher::LeaderStream GroupDispatcher::ForwardStream(const std::shared_ptr<LeaderConnection>& leader,
                                                             grpc::ClientContext& ctx, const std::shared_ptr<Job>& job,
                                                             v1::Mode mode, double queue_ms,
                                                             const internal::SessionStep* session) {
  LeaderStream stream;
  absl::Time first_message = absl::InfiniteFuture();
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader;
  {
    // The request goes as the client sent it, serialised from the job's own
    // copy (lent to the RunRequest, never copied: a latent can be large)
    // beside the scheduler's choices.
    internal::RunRequest run;
    run.set_mode(mode);
    run.set_max_chunk_bytes(g_.options.max_chunk_bytes);
    run.unsafe_arena_set_allocated_request(const_cast<v1::DecodeRequest*>(&job->request()));
    if (job->encode() != nullptr) run.unsafe_arena_set_allocated_encode(const_cast<v1::EncodeRequest*>(job->encode()));
    if (session != nullptr) run.unsafe_arena_set_allocated_session(const_cast<internal::SessionStep*>(session));
    reader = leader->stub->Run(&ctx, run);  // sends (serialises) the request
    run.unsafe_arena_release_request();
    if (job->encode() != nullptr) run.unsafe_arena_release_encode();
    if (session != nullptr) run.unsafe_arena_release_session();
  }
  v1::DecodeResponse message;
  while (reader->Read(&message)) {
    if (stream.client_gone) continue;  // drain after TryCancel
    const absl::Time now = absl::Now();
    if (first_message == absl::InfiniteFuture()) first_message = now;
    if (message.has_header()) {
      stream.got_header = true;
      const v1::Header& h = message.header();
      job->UpdateReport([&](JobReport& r) {
        r.mode = rpc::ModeLabel(h.mode());
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
        r.peak_bytes_per_rank.assign(trailer.peak_bytes_per_rank().begin(), trailer.peak_bytes_per_rank().end());
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

bool GroupDispatcher::LeaderIdleWithin(const std::shared_ptr<LeaderConnection>& leader, absl::Duration wait) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Now() + wait + kStatusDeadline);
  internal::StatusRequest request;
  request.set_wait_idle_ms(absl::ToInt64Milliseconds(wait));
  internal::StatusResponse idle;
  return leader->stub->Status(&ctx, request, &idle).ok() && idle.idle();
}

void GroupDispatcher::AwaitLeaderIdle(const std::shared_ptr<LeaderConnection>& leader, const Job& job) {
  // The call ends at once, but the leader stops at its next op: wait for
  // it, so that the group's next request does not start on a busy leader
  // (whose wait would show in no timing field), and measure the release.
  // A leader that takes longer is out of rotation (readiness says so while
  // no other group serves its models), and rebuilt past the bound.
  const std::string& group = g_.options.name;
  // Pausing and resuming apply only while `leader` is still the group's
  // ready incarnation: a group the supervisor is rebuilding meanwhile must
  // not be left paused, or shown ready. (Checked under the group's lock,
  // applied after it: the catalog's listener asks the groups for their
  // state, which takes that lock.)
  const auto set_in_rotation = [this, &leader, &group](bool in_rotation) {
    {
      absl::MutexLock lock(&g_.mu);
      if (g_.phase != GroupState::Phase::kReady || g_.leader != leader || !leader->broken_reason.empty()) {
        return false;
      }
    }
    g_.catalog.GroupPaused(group, !in_rotation);
    g_.metrics.SetGroupReady(group, in_rotation);
    return true;
  };
  bool idle = LeaderIdleWithin(leader, kReleaseGrace);
  if (!idle && set_in_rotation(false)) {
    spdlog::info("group={} event=busy_after_cancel request_id={} action=out_of_rotation rebuild_after_s={}", group,
                 rpc::LogValue(job.request_id()), absl::ToInt64Seconds(g_.options.cancel_release_timeout));
    idle = LeaderIdleWithin(leader, g_.options.cancel_release_timeout - kReleaseGrace);
    if (idle && set_in_rotation(true)) {
      spdlog::info("group={} event=released_after_cancel request_id={} action=back_in_rotation", group,
                   rpc::LogValue(job.request_id()));
    }
  }
  {
    absl::MutexLock lock(&g_.mu);
    if (g_.leader == leader) g_.leader_may_be_busy = !idle;
  }
  const absl::Time cancelled = job.cancelled_at();
  if (cancelled < absl::InfiniteFuture()) {
    const absl::Duration release = absl::Now() - cancelled;
    g_.metrics.RecordCancelRelease(absl::ToDoubleSeconds(release));
    spdlog::debug("group={} event=released_after_cancel request_id={} release_ms={:.1f} leader_idle={}", group,
                  rpc::LogValue(job.request_id()), Ms(release), idle);
  }
  if (!idle) {
    ReportFailure(leader, absl::StrCat("the leader was still busy ",
                                       absl::ToInt64Seconds(g_.options.cancel_release_timeout), " s after request ",
                                       rpc::LogValue(job.request_id()), " was cancelled (--cancel_release_timeout_s)"));
  }
}

void GroupDispatcher::Conclude(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job,
                               const LeaderStream& stream) {
  std::string broken;
  {
    absl::MutexLock lock(&g_.mu);
    broken = leader->broken_reason;
  }
  if (!broken.empty()) {
    if (job->session() != nullptr && stream.finished.ok() && stream.got_header && stream.got_trailer) {
      // The chunk reached its client whole before the group broke: done. Its
      // state went with the group, so the next chunk replays.
      job->session()->ChunkDone(leader->incarnation, job->request().latent());
      job->session()->StateLost();
      return job->Finish(absl::OkStatus());
    }
    if (RetrySessionChunk(job, broken)) return;
    job->Finish(absl::UnavailableError(absl::StrCat("worker group ", g_.options.name, " failed during the decode: ",
                                                    broken, "; the group is being rebuilt, retry")));
    return;
  }
  if (!stream.finished.ok()) {
    const absl::Status s = rpc::FromGrpcStatus(stream.finished);
    if (absl::IsUnavailable(s)) {
      // The leader died, or reported that its communicator failed.
      const std::string reason = ReportFailure(leader, std::string(s.message()));
      if (RetrySessionChunk(job, reason)) return;
      job->Finish(absl::UnavailableError(absl::StrCat("worker group ", g_.options.name, " failed during the decode: ",
                                                      reason, "; the group is being rebuilt, retry")));
      return;
    }
    // The leader lost the session's state (a chunk failed after advancing
    // it): replayed on the next try.
    if (absl::IsFailedPrecondition(s) && RetrySessionChunk(job, std::string(s.message()))) return;
    if (job->session() != nullptr) job->session()->StateLost();
    job->Finish(s);
    return;
  }
  if (!stream.got_header || !stream.got_trailer) {
    job->Finish(
        absl::InternalError(absl::StrCat("worker group ", g_.options.name, ": the leader's stream ended without a ",
                                         stream.got_header ? "trailer" : "header")));
    return;
  }
  const JobReport report = job->report();
  double most_waited_ms = 0;  // the rank that waited longest in collectives
  for (double ms : report.collective_wait_ms_per_rank) most_waited_ms = std::max(most_waited_ms, ms);
  g_.metrics.RecordDecode(job->model().name(), job->model().family(), report.mode, report.degree,
                          report.timings.decode_ms() / 1000, report.timings.gather_ms() / 1000, report.collectives,
                          most_waited_ms / 1000);
  g_.metrics.RecordStreamTime(report.timings.stream_ms() / 1000);
  if (report.tile_retries > 0) g_.metrics.RecordTileRetries(job->model().name(), report.tile_retries);
  if (job->session() != nullptr) job->session()->ChunkDone(leader->incarnation, job->request().latent());
  job->Finish(absl::OkStatus());
  g_.RefreshMemory(*leader);
}

}  // namespace vaedecode::server
