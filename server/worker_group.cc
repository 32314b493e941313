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
#include "rpc/log_field.h"
#include "rpc/status.h"
#include "server/worker_group_internal.h"

namespace vaedecode::server {
namespace {

using worker_group_internal::kExplainWindow;
using worker_group_internal::Ms;
using worker_group_internal::SetDeadline;

constexpr absl::Duration kPoll = absl::Milliseconds(50);
constexpr absl::Duration kProbeDeadline = absl::Seconds(1);
// How long a clean stop waits for the ranks to exit on their own.
constexpr absl::Duration kGracefulStop = absl::Seconds(5);

std::string DescribeExit(int code) {
  if (code > 128 && code < 128 + 65) {
    const char* name = strsignal(code - 128);
    return absl::StrCat("was killed by signal ", code - 128, " (", name ? name : "?", ")");
  }
  return absl::StrCat("exited with code ", code);
}

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

// ---- supervisor (the dispatcher is in worker_dispatch.cc) ------------------

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

}  // namespace vaedecode::server
