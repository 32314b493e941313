#pragma once

// `vaedecode decode --mode exact --ranks N`: the calling process becomes rank
// 0 (the leader) of a local Gloo group and starts ranks 1..N-1 as child
// processes of the same binary (`vaedecode rank ...`, an internal command).
// The leader broadcasts the job, every rank decodes its band, the leader
// receives the whole output. A failing rank aborts the group: every rank
// returns an error within the timeout, and the leader kills and reaps every
// child before it returns.

#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/args.h"
#include "families/decoder.h"
#include "parallel/counting_communicator.h"
#include "worker/exact_decode.h"

namespace vaedecode::cli {

struct GroupLaunch {
  int ranks = 1;
  std::string model_path;  // "" for the embedded default
  std::string dtype_name = "float32";
  int threads = 1;
  absl::Duration timeout = absl::Seconds(120);
};

struct LocalGroupResult {
  worker::GroupDecodeResult decode;     // the leader's result (whole sample)
  std::vector<worker::RankStats> ranks;  // every rank's time and peak memory
  parallel::CommStats comm;              // the leader's calls during the decode
};

// Leader side. `decoder` is the leader's own loaded model.
absl::StatusOr<LocalGroupResult> DecodeWithLocalGroup(const GroupLaunch& launch,
                                                      families::Decoder& decoder,
                                                      const worker::DecodeJob& job);

// Peer side: the internal `rank` command.
absl::Status RunRank(const ParsedArgs& args);

}  // namespace vaedecode::cli
