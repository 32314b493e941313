#pragma once

// One static group of worker processes (one per device) and the two threads
// that drive it:
//
//  * the supervisor spawns the group's ranks (`vaedecode_worker`), waits
//    until the leader (rank 0) answers GroupLeader.Models on its Unix socket,
//    publishes the group's models to the catalog, then watches the processes.
//    When a rank exits or stops sending heartbeats (hung or SIGSTOPped:
//    see rank_heartbeats.h), or the dispatcher reports the group broken, it cancels
//    the running call, kills every rank and builds a new incarnation (new
//    group name, store port and socket: nothing of the old one is reused).
//    Failed starts back off exponentially.
//  * the dispatcher takes jobs from the scheduler while the group is ready,
//    one at a time (the leader runs one decode at a time), picks the mode
//    from the group's free memory, forwards the job to the leader's Run and
//    the leader's stream into the job, and finishes the job.
//
// A worker that dies fails only the job running on its group (UNAVAILABLE,
// with the rank, device and exit status); queued jobs wait for the rebuild
// or go to another group.
//
// Threading: Start/Stop from one owner thread; ready()/busy() from any. The
// group's lock is never held while calling into a Job, the Scheduler or the
// catalog (only TryCancel on the running leader call happens under it).
// Ownership: the scheduler, catalog and metrics are borrowed and must
// outlive the group. The child processes belong to the supervisor thread.

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/mode_selection.h"
#include "server/model_catalog.h"
#include "server/rank_heartbeats.h"
#include "server/scheduler.h"
#include "vaedecode/internal/worker.grpc.pb.h"
#include "rpc/child_process.h"

namespace vaedecode::server {

struct WorkerGroupOptions {
  std::string name;                  // "g0"
  std::vector<std::string> devices;  // rank r runs on devices[r]
  std::string worker_binary;         // path of vaedecode_worker
  std::string model_repository;      // "" = the embedded default model
  std::string dtype = "float32";
  int threads = 1;  // intra-op threads per worker
  int collective_timeout_s = 300;
  int64_t memory_budget_mib = 0;
  std::string socket_dir;  // leader sockets go here (short path: 108-byte limit)
  absl::Duration start_timeout = absl::Minutes(5);
  int64_t max_chunk_bytes = 1 << 20;
  absl::Duration restart_backoff = absl::Milliseconds(500);  // after a failed start; doubles
  absl::Duration max_restart_backoff = absl::Seconds(30);
  // A rank whose heartbeats stop for this long is hung: the group is failed
  // and rebuilt. Zero: no heartbeats (only exits and collective timeouts).
  absl::Duration heartbeat_timeout = absl::Seconds(5);
};

class WorkerGroup {
 public:
  WorkerGroup(WorkerGroupOptions options, Scheduler& scheduler, ModelCatalog& catalog,
              ServerMetrics& metrics);
  ~WorkerGroup();  // Stop()
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts the supervisor and dispatcher threads.
  void Start();
  // Cancels the running job, kills the workers and joins the threads.
  // Idempotent.
  void Stop();

  const std::string& name() const { return options_.name; }
  bool ready() const;
  // A job is running on the group.
  bool busy() const;

 private:
  enum class State { kStarting, kReady, kBroken, kStopped };

  // One incarnation of the group, as the dispatcher sees it.
  struct Leader {
    std::string incarnation;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<internal::GroupLeader::Stub> stub;
    // Guarded by WorkerGroup::mu_. Why this incarnation broke ("" while it
    // is healthy); set once by the supervisor, never cleared.
    std::string broken_reason;
    // Guarded by WorkerGroup::mu_. A failure the dispatcher saw (the
    // leader's call failed as UNAVAILABLE); wakes the supervisor.
    std::string reported_failure;
  };

  void SupervisorLoop();
  void DispatcherLoop();
  // Spawns the ranks of incarnation `generation` into `children` and waits
  // until the leader answers Models.
  absl::StatusOr<std::shared_ptr<Leader>> Launch(int generation,
                                                 std::vector<rpc::ChildProcess>& children,
                                                 RankHeartbeats& heartbeats,
                                                 std::vector<v1::ModelInfo>& models);
  // Waits until a rank exits or stops answering, the dispatcher reports a
  // failure or Stop; returns why.
  std::string Monitor(const std::shared_ptr<Leader>& leader,
                      std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats);
  // Asks the leader to shut the group down (SIGTERM), waits a moment for
  // every rank to exit, kills what is left.
  void StopGracefully(std::vector<rpc::ChildProcess>& children);
  // The first rank found exited, described; "" when all run.
  std::string FindExited(std::vector<rpc::ChildProcess>& children);
  // The first rank silent past the heartbeat timeout, described; "" when none.
  std::string FindHung(std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats);
  // ---- dispatcher (worker_dispatch.cc)
  // One job on the group: mode, call, stream, conclusion.
  void RunJob(const std::shared_ptr<Leader>& leader, const std::shared_ptr<Job>& job);
  // The scheduler's choice for `job`, waiting while nothing fits the group's
  // free memory; nullopt when the job was finished or requeued meanwhile.
  std::optional<ModeChoice> ChooseMode(const std::shared_ptr<Leader>& leader, const std::shared_ptr<Job>& job);
  // What the leader's stream held.
  struct LeaderStream {
    grpc::Status finished;
    bool got_header = false;
    bool got_trailer = false;
    bool client_gone = false;  // the job's client stopped reading: the call was cancelled
  };
  // Reads the leader's Run stream into the job.
  LeaderStream ForwardStream(const std::shared_ptr<Leader>& leader, grpc::ClientContext& ctx,
                             const std::shared_ptr<Job>& job, double queue_ms);
  // After a cancelled call: waits for the leader to stop, records the release.
  void AwaitLeaderIdle(const std::shared_ptr<Leader>& leader, const Job& job);
  // Finishes the job from the call's outcome, with its metrics.
  void Conclude(const std::shared_ptr<Leader>& leader, const std::shared_ptr<Job>& job, const LeaderStream& stream);
  // Dispatcher: the leader failed with `message`; returns the reason to
  // report (the supervisor's, naming the dead rank, when it finds one).
  std::string ReportFailure(const std::shared_ptr<Leader>& leader, const std::string& message);
  // Dispatcher: waits up to `timeout` for the supervisor to declare
  // `leader` broken (without reporting anything); its reason, or "".
  std::string WaitBroken(const std::shared_ptr<Leader>& leader, absl::Duration timeout);
  void RefreshMemory(const std::shared_ptr<Leader>& leader);
  // Sleeps up to `d` unless stopping; false when stopping.
  bool SleepUnlessStopping(absl::Duration d);

  const WorkerGroupOptions options_;
  Scheduler& scheduler_;
  ModelCatalog& catalog_;
  ServerMetrics& metrics_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kStarting;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Leader> leader_ ABSL_GUARDED_BY(mu_);
  // The dispatcher's call to the leader, cancelled when the group breaks.
  grpc::ClientContext* running_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // The last call was cancelled and the leader did not report idle in time:
  // it may still be finishing its op.
  bool leader_may_be_busy_ ABSL_GUARDED_BY(mu_) = false;

  std::thread supervisor_;
  std::thread dispatcher_;
};

}  // namespace vaedecode::server
