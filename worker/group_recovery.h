#pragma once

// Re-forms a worker group's communicator in place after a failure every rank
// survived. The case it exists for: one rank runs out of memory inside an
// exact (sharded) decode while its peers wait in exchanges with it. The
// communicator is fail-stop (communicator.h), so that rank aborts it, every
// rank unwinds the job and frees its tensors, and the group used to be torn
// down and started again, models reloaded. Instead every rank posts its
// verdict on the failure in the group's store, and when all agree the
// processes are sound they join a fresh communicator of the next generation
// and serve on; the leader answers RESOURCE_EXHAUSTED.
//
// A rank that is really broken (any error but an out-of-memory of its own or
// a peer's abort), that timed out in a collective, or that does not post
// within the timeout (crashed, stopped) makes the agreement fail: the caller
// then marks the group broken, and the supervisor rebuilds it as before.

#include <functional>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/communicator.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace vaedecode::worker {

// A group that re-formed in place.
struct Recovered {
  absl::Status answer;  // for the failed job: RESOURCE_EXHAUSTED naming who ran out of memory
};

class GroupRecovery {
 public:
  // Joins the group's communicator called `name` (every rank passes the same
  // name; a new one per generation, as store.h asks).
  using Connect = std::function<absl::StatusOr<std::unique_ptr<parallel::Communicator>>(const std::string& name)>;

  // `store`: the group's store, which outlives every generation's
  // communicator (rank 0 hosts it). `timeout` bounds the agreement.
  GroupRecovery(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank, int world_size,
                absl::Duration timeout, Connect connect);
  ~GroupRecovery();

  // Generation 0: the communicator named `group_name`.
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> ConnectFirst();

  // Called by every rank whose job failed with `failure`, a status its group
  // cannot serve on (not in step). Replaces *comm (aborted) with the next
  // generation's and returns the status to answer the job with. An error
  // when the group cannot recover in place; *comm is then left as it was.
  absl::StatusOr<Recovered> Recover(const absl::Status& failure, std::unique_ptr<parallel::Communicator>* comm);

  // Communicators formed so far after the first.
  int generation() const { return generation_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  const std::string group_name_;
  const int rank_;
  const int world_size_;
  const absl::Duration timeout_;
  const Connect connect_;
  int generation_ = 0;
};

// The name of generation `generation` of group `group_name`'s communicator.
std::string CommunicatorName(const std::string& group_name, int generation);

}  // namespace vaedecode::worker
