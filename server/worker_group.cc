#include "server/worker_group.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rpc/free_port.h"
#include "rpc/leader_call.h"
#include "rpc/log_field.h"
#include "server/mode_selection.h"
#include "rpc/status.h"

namespace vaedecode::server {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(50);
constexpr absl::Duration kProbeDeadline = absl::Seconds(1);
constexpr absl::Duration kStatusDeadline = absl::Seconds(2);
// How often a job that fits no memory asks the group again.
constexpr absl::Duration kMemoryPoll = absl::Milliseconds(250);
// How long the supervisor looks for a dead rank to explain a failure the
// leader reported (a process's socket closes a moment before it is reapable).
constexpr absl::Duration kExplainWindow = absl::Milliseconds(300);
// How long the dispatcher waits for the leader to stop a cancelled job.
constexpr absl::Duration kIdleWait = absl::Seconds(30);
// How long a clean stop waits for the ranks to exit on their own.
constexpr absl::Duration kGracefulStop = absl::Seconds(5);

std::string DescribeExit(int code) {
  if (code > 128 && code < 128 + 65) {
    const char* name = strsignal(code - 128);
    return absl::StrCat("was killed by signal ", code - 128, " (", name ? name : "?", ")");
  }
  return absl::StrCat("exited with code ", code);
}

void SetDeadline(grpc::ClientContext& ctx, absl::Time deadline) {
  if (deadline < absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

WorkerGroup::WorkerGroup(WorkerGroupOptions options, Scheduler& scheduler, ModelCatalog& catalog,
                         ServerMetrics& metrics)
    : options_(std::move(options)), scheduler_(scheduler), catalog_(catalog), metrics_(metrics) {}

WorkerGroup::~WorkerGroup() { Stop(); }

void WorkerGroup::Start() {
  metrics_.SetGroupReady(options_.name, false);
  metrics_.InitGroup(options_.name);
  supervisor_ = std::thread([this] { SupervisorLoop(); });
  dispatcher_ = std::thread([this] { DispatcherLoop(); });
}

void WorkerGroup::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (running_ != nullptr) running_->TryCancel();
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (dispatcher_.joinable()) dispatcher_.join();
}

bool WorkerGroup::ready() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kReady;
}

bool WorkerGroup::busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

bool WorkerGroup::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

// ---- supervisor -----------------------------------------------------------

void WorkerGroup::SupervisorLoop() {
  absl::Duration backoff = options_.restart_backoff;
  for (int generation = 1;; ++generation) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      state_ = State::kStarting;
    }
    if (generation > 1) metrics_.RecordWorkerRestart(options_.name);
    std::vector<rpc::ChildProcess> children;
    std::vector<v1::ModelInfo> models;
    const absl::Time t0 = absl::Now();
    absl::StatusOr<RankHeartbeats> heartbeats =
        RankHeartbeats::Create(static_cast<int>(options_.devices.size()));
    absl::StatusOr<std::shared_ptr<Leader>> leader =
        heartbeats.ok() ? Launch(generation, children, *heartbeats, models)
                        : absl::StatusOr<std::shared_ptr<Leader>>(heartbeats.status());
    if (!leader.ok()) {
      for (auto& c : children) c.Kill();
      if (absl::IsCancelled(leader.status())) break;  // stopping
      spdlog::error(
          "group={} event=start_failed generation={} status={} message={} retry_in_s={}",
          options_.name, generation, rpc::StatusCodeName(leader.status().code()),
          rpc::LogValue(leader.status().message()), absl::ToDoubleSeconds(backoff));
      if (!SleepUnlessStopping(backoff)) break;
      backoff = std::min(backoff * 2, options_.max_restart_backoff);
      continue;
    }
    backoff = options_.restart_backoff;
    std::vector<std::string> names;
    for (const auto& m : models) names.push_back(m.name());
    {
      absl::MutexLock lock(&mu_);
      leader_ = *leader;
      state_ = State::kReady;
      leader_may_be_busy_ = false;  // a new incarnation has run nothing
    }
    RefreshMemory(*leader);
    catalog_.GroupReady(options_.name, models);
    metrics_.SetGroupReady(options_.name, true);
    for (const v1::ModelInfo& m : models) metrics_.InitModel(m.name());
    spdlog::info("group={} event=ready incarnation={} devices={} models={} start_ms={:.0f}",
                 options_.name, (*leader)->incarnation, absl::StrJoin(options_.devices, ","),
                 absl::StrJoin(names, ","), Ms(absl::Now() - t0));

    const std::string reason = Monitor(*leader, children, *heartbeats);
    // Health first, so a client that sees its call fail already sees the
    // model NOT_SERVING (unless another group serves it).
    catalog_.GroupDown(options_.name);
    metrics_.SetGroupReady(options_.name, false);
    bool stopping;
    bool idle;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
      idle = !busy_ && !leader_may_be_busy_;
      state_ = stopping ? State::kStopped : State::kBroken;
      (*leader)->broken_reason = reason;
      leader_.reset();
      if (running_ != nullptr) running_->TryCancel();
    }
    if (stopping) {
      // A decode still running when the server stops (or still stopping
      // after its call was cancelled) was cut by the drain: no point waiting.
      if (idle) StopGracefully(children);
      for (auto& c : children) c.Kill();
      break;
    }
    for (auto& c : children) c.Kill();
    spdlog::warn("group={} event=broken incarnation={} reason={} action=rebuild", options_.name,
                 (*leader)->incarnation, rpc::LogValue(reason));
  }
  absl::MutexLock lock(&mu_);
  state_ = State::kStopped;
  leader_.reset();
}

absl::StatusOr<std::shared_ptr<WorkerGroup::Leader>> WorkerGroup::Launch(
    int generation, std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats,
    std::vector<v1::ModelInfo>& models) {
  const int world = static_cast<int>(options_.devices.size());
  const std::string incarnation = absl::StrCat(options_.name, "-inc", generation);
  absl::StatusOr<int> port = rpc::PickFreePort();
  if (!port.ok()) return port.status();
  const std::string socket_path = absl::StrCat(options_.socket_dir, "/", incarnation, ".sock");
  std::error_code ec;
  std::filesystem::remove(socket_path, ec);

  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {
        options_.worker_binary,
        absl::StrCat("--rank=", r),
        absl::StrCat("--world=", world),
        absl::StrCat("--group=", incarnation),
        absl::StrCat("--store_port=", *port),
        absl::StrCat("--model_repository=", options_.model_repository),
        absl::StrCat("--device=", options_.devices[r]),
        absl::StrCat("--dtype=", options_.dtype),
        absl::StrCat("--threads=", options_.threads),
        absl::StrCat("--collective_timeout_s=", options_.collective_timeout_s),
        absl::StrCat("--memory_budget_mib=", options_.memory_budget_mib),
    };
    if (r == 0) argv.push_back(absl::StrCat("--socket=", socket_path));
    rpc::SpawnOptions spawn;
    if (options_.heartbeat_timeout > absl::ZeroDuration()) {
      spawn.fd3 = heartbeats.write_fd(r);
      argv.push_back("--heartbeat_fd=3");
    }
    absl::StatusOr<rpc::ChildProcess> child = rpc::ChildProcess::Spawn(argv, spawn);
    if (!child.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot start rank ", r, " (", options_.worker_binary, "): ", child.status().message()));
    }
    children.push_back(*std::move(child));
  }
  heartbeats.CloseWriteEnds();

  auto leader = std::make_shared<Leader>();
  leader->incarnation = incarnation;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // The socket appears only once the leader is up: retry connecting quickly.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  leader->channel = grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path),
                                              grpc::InsecureChannelCredentials(), args);
  leader->stub = internal::GroupLeader::NewStub(leader->channel);

  const absl::Time give_up = absl::Now() + options_.start_timeout;
  while (true) {
    const std::string exited = FindExited(children);
    if (!exited.empty()) {
      return absl::UnavailableError(absl::StrCat(incarnation, ": ", exited, " during start-up"));
    }
    const std::string hung = FindHung(children, heartbeats);
    if (!hung.empty()) {
      return absl::UnavailableError(absl::StrCat(incarnation, ": ", hung, " during start-up"));
    }
    if (std::filesystem::exists(socket_path, ec)) {
      grpc::ClientContext ctx;
      SetDeadline(ctx, absl::Now() + kProbeDeadline);
      v1::ListModelsResponse response;
      const grpc::Status s = leader->stub->Models(&ctx, v1::ListModelsRequest(), &response);
      if (s.ok()) {
        models.assign(response.models().begin(), response.models().end());
        return leader;
      }
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat(incarnation, ": the leader did not answer Models within ",
                       absl::FormatDuration(options_.start_timeout)));
    }
    if (!SleepUnlessStopping(absl::Milliseconds(100))) {
      return absl::CancelledError("the server is stopping");
    }
  }
}

void WorkerGroup::StopGracefully(std::vector<rpc::ChildProcess>& children) {
  // The leader's SIGTERM handler stops its server and sends the peers the
  // group's shutdown job, so every rank exits 0 in order; killing them in
  // turn instead made the peers log the leader's lost connection as a
  // broken group.
  if (!children.empty()) children[0].Signal(SIGTERM);
  const absl::Time give_up = absl::Now() + kGracefulStop;
  for (size_t r = 0; r < children.size(); ++r) {
    rpc::ChildProcess& c = children[r];
    if (c.pid() < 0) continue;
    absl::StatusOr<int> code = c.Wait(give_up);
    if (!code.ok()) {
      spdlog::warn("group={} event=stop_timeout rank={} pid={} message=\"a rank did not exit within {} s of the "
                   "group's shutdown; killed\"",
                   options_.name, r, c.pid(), absl::ToDoubleSeconds(kGracefulStop));
    }
  }
  for (auto& c : children) c.Kill();
}

std::string WorkerGroup::FindExited(std::vector<rpc::ChildProcess>& children) {
  for (size_t r = 0; r < children.size(); ++r) {
    const pid_t pid = children[r].pid();
    if (pid < 0) continue;
    absl::StatusOr<int> code = children[r].Wait(absl::InfinitePast());
    if (code.ok()) {
      return absl::StrCat("rank ", r, " (pid ", pid, ", ", options_.devices[r], ") ",
                          DescribeExit(*code));
    }
  }
  return "";
}

std::string WorkerGroup::FindHung(std::vector<rpc::ChildProcess>& children,
                                  RankHeartbeats& heartbeats) {
  if (options_.heartbeat_timeout <= absl::ZeroDuration()) return "";
  absl::Duration silent;
  const int r = heartbeats.FindSilent(options_.heartbeat_timeout, &silent);
  if (r < 0) return "";
  return absl::StrCat("rank ", r, " (pid ", children[r].pid(), ", ", options_.devices[r],
                      ") stopped answering: no heartbeat for ",
                      absl::StrFormat("%.1f", absl::ToDoubleSeconds(silent)), " s (hung or stopped)");
}

std::string WorkerGroup::Monitor(const std::shared_ptr<Leader>& leader,
                                 std::vector<rpc::ChildProcess>& children,
                                 RankHeartbeats& heartbeats) {
  heartbeats.HeardAllNow();
  while (true) {
    const std::string exited = FindExited(children);
    if (!exited.empty()) return exited;
    const std::string hung = FindHung(children, heartbeats);
    if (!hung.empty()) return hung;
    std::string reported;
    {
      absl::MutexLock lock(&mu_);
      const auto wake = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !leader->reported_failure.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), kPoll);
      if (stopping_) return "the server is stopping";
      reported = leader->reported_failure;
    }
    if (!reported.empty()) {
      // Prefer naming the rank that died, if one did.
      const absl::Time until = absl::Now() + kExplainWindow;
      while (absl::Now() < until) {
        const std::string dead = FindExited(children);
        if (!dead.empty()) return dead;
        absl::SleepFor(absl::Milliseconds(20));
      }
      return reported;
    }
  }
}

// ---- dispatcher -----------------------------------------------------------

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
  const absl::Time dispatched = absl::Now();
  const double queue_ms = Ms(dispatched - job->received());
  job->UpdateReport([&](JobReport& r) {
    r.group = options_.name;
    r.timings.set_queue_ms(queue_ms);
  });

  // The group's resources, for the mode choice; asked again while nothing
  // fits the group's free memory, until the request's deadline.
  absl::StatusOr<ModeChoice> choice;
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
        return;
      }
    }
    choice = SelectMode(job->request(), job->model(), resources);
    if (!choice.ok() || !choice->wait_for_memory) break;
    if (!waiting_for_memory) metrics_.AddMemoryWaits(1);
    waiting_for_memory = true;
    if (absl::Now() + kMemoryPoll >= job->deadline()) {
      stop_waiting();
      job->Finish(absl::DeadlineExceededError(
          absl::StrCat("deadline exceeded while waiting for memory: ", choice->reason)));
      return;
    }
    // The wait holds the group: it ends with the caller (cancelled: the job
    // finished itself) and with the server.
    if (!SleepUnlessStopping(kMemoryPoll)) {
      stop_waiting();
      job->Finish(absl::UnavailableError(
          absl::StrCat("the server is stopping; the request was waiting for memory: ", choice->reason)));
      return;
    }
    if (job->over()) {
      stop_waiting();
      return;
    }
  }
  stop_waiting();
  if (!choice.ok()) {
    job->Finish(choice.status());
    return;
  }
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

  bool got_header = false;
  bool got_trailer = false;
  bool client_gone = false;
  absl::Time first_message = absl::InfiniteFuture();
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader = leader->stub->Run(&ctx, job->request());
  v1::DecodeResponse message;
  while (reader->Read(&message)) {
    if (client_gone) continue;  // drain after TryCancel
    const absl::Time now = absl::Now();
    if (first_message == absl::InfiniteFuture()) first_message = now;
    if (message.has_header()) {
      got_header = true;
      const v1::Header& h = message.header();
      job->UpdateReport([&](JobReport& r) {
        r.mode = ModeName(h.mode());
        r.mode_reason = h.mode_reason();
        r.degree = h.degree();
        r.output_shape.assign(h.shape().begin(), h.shape().end());
      });
    } else if (message.has_trailer()) {
      got_trailer = true;
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
        r.decoded = true;
      });
    } else if (!got_header) {
      continue;  // a chunk before the header is a leader bug: dropped, caught below
    }
    if (!job->Push(std::move(message))) {
      client_gone = true;
      ctx.TryCancel();
    }
    message.Clear();
  }
  const grpc::Status finished = reader->Finish();
  job->ClearCancelHook();
  unregister();
  metrics_.AddInFlight(-1);

  {
    absl::MutexLock lock(&mu_);
    leader_may_be_busy_ = false;
  }
  if (client_gone || job->over()) {  // cancelled: the job finishes itself
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
    const absl::Time cancelled = job->cancelled_at();
    if (cancelled < absl::InfiniteFuture()) {
      const absl::Duration release = absl::Now() - cancelled;
      metrics_.RecordCancelRelease(absl::ToDoubleSeconds(release));
      spdlog::debug("group={} event=released_after_cancel request_id={} release_ms={:.1f} leader_idle={}",
                    options_.name, rpc::LogValue(job->request_id()), Ms(release), answered && idle.idle());
    }
    return;
  }
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
  if (!finished.ok()) {
    const absl::Status s = rpc::FromGrpcStatus(finished);
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
  if (!got_header || !got_trailer) {
    job->Finish(absl::InternalError(absl::StrCat("worker group ", options_.name,
                                                 ": the leader's stream ended without a ",
                                                 got_header ? "trailer" : "header")));
    return;
  }
  const JobReport report = job->report();
  metrics_.RecordDecode(job->model().name(), job->model().family(), report.mode, report.degree,
                        report.timings.decode_ms() / 1000, report.timings.gather_ms() / 1000,
                        report.collectives);
  metrics_.RecordStreamTime(report.timings.stream_ms() / 1000);
  if (report.tile_retries > 0) metrics_.RecordTileRetries(job->model().name(), report.tile_retries);
  job->Finish(absl::OkStatus());
  RefreshMemory(leader);
}

}  // namespace vaedecode::server
