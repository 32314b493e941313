#pragma once

// One static group of worker processes (one per device) and the two threads
// that drive it, each a class of its own over the state they share
// (server/group_state.h):
//
//  * the supervisor (server/group_supervisor.h) spawns the ranks, publishes
//    each incarnation and its models, watches the processes and rebuilds the
//    group when a rank exits, hangs or the dispatcher reports it broken;
//  * the dispatcher (server/group_dispatcher.h) takes jobs from the
//    scheduler while the group is ready, one at a time, and runs each on the
//    leader.
//
// A worker that dies fails only the job running on its group (UNAVAILABLE,
// with the rank, device and exit status); queued jobs wait for the rebuild
// or go to another group.
//
// Threading: Start/Stop from one owner thread; ready()/busy() from any.
// Ownership: the scheduler, catalog and metrics are borrowed and must
// outlive the group.

#include <memory>
#include <string>
#include <thread>

#include "server/group_dispatcher.h"
#include "server/group_state.h"
#include "server/group_supervisor.h"
#include "server/metrics.h"
#include "server/model_catalog.h"
#include "server/scheduler.h"
#include "server/worker_group_options.h"

namespace vaedecode::server {

class WorkerGroup {
 public:
  WorkerGroup(WorkerGroupOptions options, Scheduler& scheduler, ModelCatalog& catalog, ServerMetrics& metrics);
  ~WorkerGroup();  // Stop()
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts the supervisor and dispatcher threads.
  void Start();
  // Cancels the running job, kills the workers and joins the threads.
  // Idempotent.
  void Stop();

  const std::string& name() const { return state_.options.name; }
  bool ready() const;
  // A job is running on the group.
  bool busy() const;
  // The tightest rank's capacity as last reported; -1: unbounded or unknown.
  int64_t capacity_bytes_per_rank() const;

 private:
  GroupState state_;
  GroupSupervisor supervisor_{state_};
  GroupDispatcher dispatcher_{state_};
  std::thread supervisor_thread_;
  std::thread dispatcher_thread_;
};

}  // namespace vaedecode::server
