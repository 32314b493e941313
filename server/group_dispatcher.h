#pragma once

// A worker group's dispatcher: takes jobs from the scheduler while the group
// is ready, one at a time (the leader runs one decode at a time), picks the
// mode from the group's free memory (SelectMode), runs the job on the
// current leader (GroupLeader.Run with an internal.RunRequest: the request,
// the mode, the chunk size), forwards the leader's stream into the job and
// finishes it. A failure that looks like the group's (UNAVAILABLE) is
// reported to the supervisor, which names the dead rank when it finds one.
// A streaming session's jobs run only on the session's group: a chunk
// continues the state the leader holds, or replays the session's history
// where the leader is a new incarnation (server/session_record.h), and goes
// back to the queue when the group fails under it.
//
// Threading: Run is the dispatcher thread's body, until the group stops.

#include <grpcpp/client_context.h>

#include <memory>
#include <optional>
#include <string>

#include "server/group_state.h"
#include "server/job.h"
#include "server/mode_selection.h"
#include "vaedecode/internal/worker.pb.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

class GroupDispatcher {
 public:
  explicit GroupDispatcher(GroupState& group) : g_(group) {}

  // Runs jobs until the group stops.
  void Run();

 private:
  // One job on the group: mode, call, stream, conclusion.
  void RunJob(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job);
  // The scheduler's choice for `job`, waiting while nothing fits the group's
  // free memory; nullopt when the job was finished or requeued meanwhile.
  std::optional<ModeChoice> ChooseMode(const std::shared_ptr<LeaderConnection>& leader,
                                       const std::shared_ptr<Job>& job);
  // What the leader's stream held.
  struct LeaderStream {
    grpc::Status finished;
    bool got_header = false;
    bool got_trailer = false;
    bool client_gone = false;  // the job's client stopped reading: the call was cancelled
  };
  // Runs the job on the leader in `mode` (a session's chunk: as `session`
  // says) and reads its stream into the job.
  LeaderStream ForwardStream(const std::shared_ptr<LeaderConnection>& leader, grpc::ClientContext& ctx,
                             const std::shared_ptr<Job>& job, v1::Mode mode, double queue_ms,
                             const internal::SessionStep* session);
  // A session's close: the leader frees the session's state on every rank.
  void CloseSession(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job);
  // A session chunk whose group failed under it (or lost its state) goes
  // back to the queue, to run on the rebuilt group with the session's
  // history replayed; false when it may not (retried enough, or the server
  // is stopping), and the caller finishes it.
  bool RetrySessionChunk(const std::shared_ptr<Job>& job, const std::string& why);
  // After a cancelled call: waits for the leader to stop, records the
  // release; takes the group out of rotation after 5 s, and has it
  // rebuilt past options.cancel_release_timeout.
  void AwaitLeaderIdle(const std::shared_ptr<LeaderConnection>& leader, const Job& job);
  // Whether the leader reports idle within `wait`.
  bool LeaderIdleWithin(const std::shared_ptr<LeaderConnection>& leader, absl::Duration wait);
  // Finishes the job from the call's outcome, with its metrics.
  void Conclude(const std::shared_ptr<LeaderConnection>& leader, const std::shared_ptr<Job>& job,
                const LeaderStream& stream);
  // The leader failed with `message`; returns the reason to report (the
  // supervisor's, naming the dead rank, when it finds one).
  std::string ReportFailure(const std::shared_ptr<LeaderConnection>& leader, const std::string& message);
  // Waits up to `timeout` for the supervisor to declare `leader` broken
  // (without reporting anything); its reason, or "".
  std::string WaitBroken(const std::shared_ptr<LeaderConnection>& leader, absl::Duration timeout);

  GroupState& g_;
};

}  // namespace vaedecode::server
