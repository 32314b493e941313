#pragma once

// A worker group's supervisor: spawns the group's ranks (vaedecode_worker),
// waits until the leader (rank 0) answers GroupLeader.Models on its Unix
// socket, publishes the incarnation (GroupState) and its models (the
// catalog), then watches the processes. When a rank exits or stops sending
// heartbeats (hung or SIGSTOPped: see rank_heartbeats.h), or the dispatcher
// reports the group broken, it cancels the running call, kills every rank
// and builds a new incarnation (new group name, store port and socket:
// nothing of the old one is reused). Failed starts back off exponentially.
//
// Threading: Run is the supervisor thread's body, until the group stops.
// The child processes belong to it.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/child_process.h"
#include "server/group_state.h"
#include "server/rank_heartbeats.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

class GroupSupervisor {
 public:
  explicit GroupSupervisor(GroupState& group) : g_(group) {}

  // Builds, watches and rebuilds incarnations until the group stops.
  void Run();

 private:
  // Spawns the ranks of incarnation `generation` into `children` and waits
  // until the leader answers Models.
  absl::StatusOr<std::shared_ptr<LeaderConnection>> Launch(int generation, std::vector<rpc::ChildProcess>& children,
                                                           RankHeartbeats& heartbeats, v1::ListModelsResponse& models);
  // Waits until a rank exits or stops answering, the dispatcher reports a
  // failure or the group stops; returns why.
  std::string Monitor(const std::shared_ptr<LeaderConnection>& leader, std::vector<rpc::ChildProcess>& children,
                      RankHeartbeats& heartbeats);
  // Asks the leader to shut the group down (SIGTERM), waits a moment for
  // every rank to exit, kills what is left.
  void StopGracefully(std::vector<rpc::ChildProcess>& children);
  // The first rank found exited, described; "" when all run.
  std::string FindExited(std::vector<rpc::ChildProcess>& children);
  // The first rank silent past the heartbeat timeout, described; "" when none.
  std::string FindHung(std::vector<rpc::ChildProcess>& children, RankHeartbeats& heartbeats);

  GroupState& g_;
};

}  // namespace vaedecode::server
