#pragma once

// What a worker group's two threads share (server/worker_group.h): the
// group's options and borrowed services, and under one lock its state, its
// current leader incarnation and the call running on it. The supervisor
// (server/group_supervisor.h) writes the incarnation and the state; the
// dispatcher (server/group_dispatcher.h) runs jobs on it. Not for other
// files.
//
// Threading: every field under `mu` is read and written under it; the lock
// is never held while calling into a Job, the Scheduler or the catalog (only
// TryCancel on the running leader call happens under it).

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/metrics.h"
#include "server/model_catalog.h"
#include "server/scheduler.h"
#include "server/worker_group_options.h"
#include "vaedecode/internal/worker.grpc.pb.h"

namespace vaedecode::server {

// One incarnation of a group's leader, as the dispatcher reaches it.
struct LeaderConnection {
  std::string incarnation;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<internal::GroupLeader::Stub> stub;
  // Guarded by GroupState::mu. Why this incarnation broke ("" while it is
  // healthy); set once by the supervisor, never cleared.
  std::string broken_reason;
  // Guarded by GroupState::mu. A failure the dispatcher saw (the leader's
  // call failed as UNAVAILABLE); wakes the supervisor.
  std::string reported_failure;
};

class GroupState {
 public:
  enum class Phase { kStarting, kReady, kBroken, kStopped };

  GroupState(WorkerGroupOptions options, Scheduler& scheduler, ModelCatalog& catalog, ServerMetrics& metrics)
      : options(std::move(options)), scheduler(scheduler), catalog(catalog), metrics(metrics) {}

  const WorkerGroupOptions options;
  Scheduler& scheduler;
  ModelCatalog& catalog;
  ServerMetrics& metrics;

  mutable absl::Mutex mu;
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kStarting;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::shared_ptr<LeaderConnection> leader ABSL_GUARDED_BY(mu);
  // The dispatcher's call to the leader, cancelled when the group breaks.
  grpc::ClientContext* running ABSL_GUARDED_BY(mu) = nullptr;
  bool busy ABSL_GUARDED_BY(mu) = false;
  // The last call was cancelled and the leader did not report idle in time:
  // it may still be finishing its op.
  bool leader_may_be_busy ABSL_GUARDED_BY(mu) = false;
  // The tightest rank's capacity (what a decode may use with nothing else
  // on its device) as the leader last reported it; -1: unbounded or not
  // reported yet.
  int64_t capacity_bytes_per_rank ABSL_GUARDED_BY(mu) = -1;

  // Sleeps up to `d` unless stopping; false when stopping.
  bool SleepUnlessStopping(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu);
  // Asks the leader for its ranks' free and peak memory and publishes them
  // (missing figures leave the gauges as they are).
  void RefreshMemory(const LeaderConnection& leader) ABSL_LOCKS_EXCLUDED(mu);
};

namespace worker_group_internal {

// How long the supervisor looks for a dead rank to explain a failure the
// leader reported (a process's socket closes a moment before it is
// reapable), and the dispatcher waits for its verdict.
inline constexpr absl::Duration kExplainWindow = absl::Milliseconds(300);

inline void SetDeadline(grpc::ClientContext& ctx, absl::Time deadline) {
  if (deadline < absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
}

inline double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace worker_group_internal
}  // namespace vaedecode::server
