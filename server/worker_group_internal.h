#pragma once

// What the two halves of WorkerGroup share (worker_group.cc: the
// supervisor; worker_dispatch.cc: the dispatcher). Not for other files.

#include <grpcpp/client_context.h>

#include "absl/time/time.h"

namespace vaedecode::server::worker_group_internal {

// How long the supervisor looks for a dead rank to explain a failure the
// leader reported (a process's socket closes a moment before it is
// reapable), and the dispatcher waits for its verdict.
inline constexpr absl::Duration kExplainWindow = absl::Milliseconds(300);

inline void SetDeadline(grpc::ClientContext& ctx, absl::Time deadline) {
  if (deadline < absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
}

inline double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace vaedecode::server::worker_group_internal
