#pragma once

// The CLI's worker group: the calling process is rank 0 (the leader) of a
// worker::GroupRuntime, the service's own runtime, over a local Gloo group;
// `decode --mode exact --ranks N` starts ranks 1..N-1 as child processes of
// the same binary (`vaedecode rank ...`, an internal command), which follow
// the leader's jobs like a service worker's peers. Dense and tiled decodes
// run on a group of one. A failing rank aborts the group: every rank
// returns an error within the timeout, and the leader kills and reaps every
// child before it returns.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "rpc/child_process.h"
#include "worker/group_runtime.h"
#include "worker/model_repository.h"

namespace vaedecode::cli {

struct GroupLaunch {
  int ranks = 1;
  std::string model_path;                  // "" for the embedded default
  std::optional<uint64_t> seeded_weights;  // every rank seeds its weights alike
  std::string dtype_name = "float32";
  int threads = 1;
  absl::Duration timeout = absl::Seconds(120);
};

class LocalGroup {
 public:
  // `model` is the leader's own loaded model; the peers load the same.
  static absl::StatusOr<std::unique_ptr<LocalGroup>> Start(const GroupLaunch& launch, worker::NamedModel model);
  ~LocalGroup();  // kills any rank still running

  worker::GroupRuntime& runtime() { return *runtime_; }
  // Releases the peers (the group's shutdown job) and waits for them to
  // exit: UNAVAILABLE naming a rank that exited with an error.
  absl::Status Stop();

 private:
  LocalGroup(GroupLaunch launch, std::vector<rpc::ChildProcess> children,
             std::unique_ptr<worker::GroupRuntime> runtime);
  const GroupLaunch launch_;
  std::vector<rpc::ChildProcess> children_;
  std::unique_ptr<worker::GroupRuntime> runtime_;
};

// Peer side: the internal `rank` command.
absl::Status RunRank(const ParsedArgs& args);

}  // namespace vaedecode::cli
