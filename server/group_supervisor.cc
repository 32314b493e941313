// GroupSupervisor (server/group_supervisor.h): a worker group's processes,
// from spawn to rebuild.

#include "server/group_supervisor.h"

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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rpc/blocked_file_io.h"
#include "rpc/free_port.h"
#include "rpc/log_field.h"
#include "rpc/status.h"
#include "rpc/status_macros.h"

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

void GroupSupervisor::Run() {
  absl::Duration backoff = g_.options.restart_backoff;
  for (int generation = 1;; ++generation) {
    {
      absl::MutexLock lock(&g_.mu);
      if (g_.stopping) break;
      g_.phase = GroupState::Phase::kStarting;
    }
    if (generation > 1) g_.metrics.RecordWorkerRestart(g_.options.name);
    std::vector<rpc::ChildProcess> children;
    v1::ListModelsResponse models;
    const absl::Time t0 = absl::Now();
    absl::StatusOr<RankHeartbeats> heartbeats = RankHeartbeats::Create(static_cast<int>(g_.options.devices.size()));
    absl::StatusOr<std::shared_ptr<LeaderConnection>> leader =
        heartbeats.ok() ? Launch(generation, children, *heartbeats, models)
                        : absl::StatusOr<std::shared_ptr<LeaderConnection>>(heartbeats.status());
    if (!leader.ok()) {
      for (auto& c : children) c.Kill();
      if (absl::IsCancelled(leader.status())) break;  // stopping
      // A repository that vanished fails its models' requests at once (they
      // would wait for a group that cannot start); the retries go on, so the
      // models come back when the folder does.
      std::error_code ec;
      const std::string& repository = g_.options.model_repository;
      if (!repository.empty() && !std::filesystem::is_directory(repository, ec)) {
        const std::string reason = absl::StrCat("the model repository ", repository, " is missing");
        if (g_.catalog.RepositoryMissing(reason)) {
          spdlog::warn("group={} event=repository_missing repository={}", g_.options.name, rpc::LogValue(repository));
          for (const v1::UnavailableModel& m : g_.catalog.Unavailable()) g_.metrics.SetModelLoadFailed(m.name(), true);
        }
      }
      spdlog::error("group={} event=start_failed generation={} status={} message={} retry_in_s={}", g_.options.name,
                    generation, rpc::StatusCodeName(leader.status().code()), rpc::LogValue(leader.status().message()),
                    absl::ToDoubleSeconds(backoff));
      if (!g_.SleepUnlessStopping(backoff)) break;
      backoff = std::min(backoff * 2, g_.options.max_restart_backoff);
      continue;
    }
    backoff = g_.options.restart_backoff;
    std::vector<std::string> names;
    for (const auto& m : models.models()) names.push_back(m.name());
    {
      absl::MutexLock lock(&g_.mu);
      g_.leader = *leader;
      g_.phase = GroupState::Phase::kReady;
      g_.leader_may_be_busy = false;  // a new incarnation has run nothing
    }
    g_.RefreshMemory(**leader);
    const std::vector<v1::UnavailableModel> news =
        g_.catalog.GroupReady(g_.options.name, {models.models().begin(), models.models().end()},
                              {models.unavailable().begin(), models.unavailable().end()});
    g_.metrics.SetGroupReady(g_.options.name, true);
    for (const v1::ModelInfo& m : models.models()) g_.metrics.InitModel(m.name());
    for (const v1::UnavailableModel& m : g_.catalog.Unavailable()) g_.metrics.SetModelLoadFailed(m.name(), true);
    for (const v1::UnavailableModel& m : news) {
      spdlog::warn("group={} model={} event=unavailable reason={}", g_.options.name, m.name(),
                   rpc::LogValue(m.reason()));
    }
    spdlog::info("group={} event=ready incarnation={} devices={} models={} start_ms={:.0f}", g_.options.name,
                 (*leader)->incarnation, absl::StrJoin(g_.options.devices, ","), absl::StrJoin(names, ","),
                 Ms(absl::Now() - t0));

    const std::string reason = Monitor(*leader, children, *heartbeats);
    // Health first, so a client that sees its call fail already sees the
    // model NOT_SERVING (unless another group serves it).
    g_.catalog.GroupDown(g_.options.name);
    g_.metrics.SetGroupReady(g_.options.name, false);
    bool stopping;
    bool idle;
    {
      absl::MutexLock lock(&g_.mu);
      stopping = g_.stopping;
      idle = !g_.busy && !g_.leader_may_be_busy;
      g_.phase = stopping ? GroupState::Phase::kStopped : GroupState::Phase::kBroken;
      (*leader)->broken_reason = reason;
      g_.leader.reset();
      if (g_.running != nullptr) g_.running->TryCancel();
    }
    if (stopping) {
      // A decode still running when the server stops (or still stopping
      // after its call was cancelled) was cut by the drain: no point waiting.
      if (idle) StopGracefully(children);
      for (auto& c : children) c.Kill();
      break;
    }
    for (auto& c : children) c.Kill();
    spdlog::warn("group={} event=broken incarnation={} reason={} action=rebuild", g_.options.name,
                 (*leader)->incarnation, rpc::LogValue(reason));
  }
  absl::MutexLock lock(&g_.mu);
  g_.phase = GroupState::Phase::kStopped;
  g_.leader.reset();
}

absl::StatusOr<std::shared_ptr<LeaderConnection>> GroupSupervisor::Launch(int generation,
                                                                          std::vector<rpc::ChildProcess>& children,
                                                                          RankHeartbeats& heartbeats,
                                                                          v1::ListModelsResponse& models) {
  const int world = static_cast<int>(g_.options.devices.size());
  const std::string incarnation = absl::StrCat(g_.options.name, "-inc", generation);
  // Held until Launch returns, by when rank 0's store listens on it.
  ASSIGN_OR_RETURN(rpc::ReservedPort reserved, rpc::ReservedPort::Take());
  const int port = reserved.port();
  const std::string socket_path = absl::StrCat(g_.options.socket_dir, "/", incarnation, ".sock");
  std::error_code ec;
  std::filesystem::remove(socket_path, ec);

  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {
        g_.options.worker_binary,
        absl::StrCat("--rank=", r),
        absl::StrCat("--world=", world),
        absl::StrCat("--group=", incarnation),
        absl::StrCat("--store_port=", port),
        absl::StrCat("--model_repository=", g_.options.model_repository),
        absl::StrCat("--device=", g_.options.devices[r]),
        absl::StrCat("--dtype=", g_.options.dtype),
        absl::StrCat("--threads=", g_.options.threads),
        absl::StrCat("--collective_timeout_s=", g_.options.collective_timeout_s),
        absl::StrCat("--memory_budget_mib=", g_.options.memory_budget_mib),
    };
    if (r == 0) argv.push_back(absl::StrCat("--socket=", socket_path));
    rpc::SpawnOptions spawn;
    if (g_.options.heartbeat_timeout > absl::ZeroDuration()) {
      spawn.fd3 = heartbeats.write_fd(r);
      argv.push_back("--heartbeat_fd=3");
    }
    absl::StatusOr<rpc::ChildProcess> child = rpc::ChildProcess::Spawn(argv, spawn);
    if (!child.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot start rank ", r, " (", g_.options.worker_binary, "): ", child.status().message()));
    }
    children.push_back(*std::move(child));
  }
  heartbeats.CloseWriteEnds();

  auto leader = std::make_shared<LeaderConnection>();
  leader->incarnation = incarnation;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // The socket appears only once the leader is up: retry connecting quickly.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  leader->channel =
      grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path), grpc::InsecureChannelCredentials(), args);
  leader->stub = internal::GroupLeader::NewStub(leader->channel);

  const absl::Time give_up = absl::Now() + g_.options.start_timeout;
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
      const grpc::Status s = leader->stub->Models(&ctx, v1::ListModelsRequest(), &models);
      if (s.ok()) return leader;
    }
    if (absl::Now() >= give_up) {
      // A rank stuck on a model file (a hung mount) is named with the file.
      std::string stuck;
      for (size_t r = 0; r < children.size(); ++r) {
        const std::string io = rpc::DescribeBlockedFileIo(children[r].pid());
        if (!io.empty()) absl::StrAppend(&stuck, "; rank ", r, " (pid ", children[r].pid(), ") waits in ", io);
      }
      return absl::DeadlineExceededError(absl::StrCat(incarnation, ": the leader did not answer Models within ",
                                                      absl::FormatDuration(g_.options.start_timeout), stuck,
                                                      stuck.empty() ? "" : " (a hung mount?)"));
    }
    if (!g_.SleepUnlessStopping(absl::Milliseconds(100))) {
      return absl::CancelledError("the server is stopping");
    }
  }
}

void GroupSupervisor::StopGracefully(std::vector<rpc::ChildProcess>& children) {
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
      spdlog::warn(
          "group={} event=stop_timeout rank={} pid={} message=\"a rank did not exit within {} s of the "
          "group's shutdown; killed\"",
          g_.options.name, r, c.pid(), absl::ToDoubleSeconds(kGracefulStop));
    }
  }
  for (auto& c : children) c.Kill();
}

std::string GroupSupervisor::FindExited(std::vector<rpc::ChildProcess>& children) {
  for (size_t r = 0; r < children.size(); ++r) {
    const pid_t pid = children[r].pid();
    if (pid < 0) continue;
    absl::StatusOr<int> code = children[r].Wait(absl::InfinitePast());
    if (code.ok()) {
      return absl::StrCat("rank ", r, " (pid ", pid, ", ", g_.options.devices[r], ") ", DescribeExit(*code));
    }
  }
  return "";
}

std::string GroupSupervisor::FindHung(std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats) {
  if (g_.options.heartbeat_timeout <= absl::ZeroDuration()) return "";
  absl::Duration silent;
  const int r = heartbeats.FindSilent(g_.options.heartbeat_timeout, &silent);
  if (r < 0) return "";
  return absl::StrCat("rank ", r, " (pid ", children[r].pid(), ", ", g_.options.devices[r],
                      ") stopped answering: no heartbeat for ", absl::StrFormat("%.1f", absl::ToDoubleSeconds(silent)),
                      " s (hung or stopped)");
}

std::string GroupSupervisor::Monitor(const std::shared_ptr<LeaderConnection>& leader,
                                     std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats) {
  heartbeats.HeardAllNow();
  while (true) {
    const std::string exited = FindExited(children);
    if (!exited.empty()) return exited;
    const std::string hung = FindHung(children, heartbeats);
    if (!hung.empty()) return hung;
    std::string reported;
    {
      absl::MutexLock lock(&g_.mu);
      const auto wake = [this, &leader]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_.mu) {
        return g_.stopping || !leader->reported_failure.empty();
      };
      g_.mu.AwaitWithTimeout(absl::Condition(&wake), kPoll);
      if (g_.stopping) return "the server is stopping";
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
