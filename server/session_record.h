#pragma once

// One open streaming session (DecodeSession) as the server keeps it: the
// group its causal state lives on, which incarnation of that group's leader
// holds the state, and the session's latent history, which a rebuilt group
// replays to rebuild the state before the next chunk (so a session survives
// a worker's death with the same output).
//
// The history is the latents the session has sent, bounded by
// max_history_bytes: a replay costs decoding the whole history again once
// (the frames are not sent again). A session past the bound goes on, but a
// group rebuilt after that cannot continue it (UNAVAILABLE, naming the
// bound).
//
// Shared (std::shared_ptr) by the session's call, the registry and its chunk
// jobs. Thread-safe.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "vaedecode/internal/worker.pb.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

class SessionRecord {
 public:
  // `id`: the group-internal id; `public_id`: the client's session id;
  // `state_bytes_per_rank`: what admission counted for its state.
  SessionRecord(int64_t id, std::string public_id, std::string group, v1::Mode mode, int64_t state_bytes_per_rank,
                int64_t max_history_bytes);

  int64_t id() const { return id_; }
  const std::string& public_id() const { return public_id_; }
  const std::string& group() const { return group_; }
  v1::Mode mode() const { return mode_; }
  // What the registry counts for the session's state on each rank: the
  // admitted estimate, then what its chunks reported (it grows where the
  // state does: HunyuanVideo 1.5's attention keeps every frame's keys).
  int64_t state_bytes_per_rank() const { return state_bytes_per_rank_.load(); }
  void set_state_bytes_per_rank(int64_t bytes) { state_bytes_per_rank_.store(bytes); }

  // The SessionStep of the next chunk on leader `incarnation`: it continues
  // the state that incarnation holds, or starts it afresh, replaying the
  // history when there is one. UNAVAILABLE when the state must be rebuilt
  // and the history was not kept (past max_history_bytes).
  absl::StatusOr<internal::SessionStep> StepOn(const std::string& incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // The chunk `latent` ([B, C, t, H, W]) was decoded on `incarnation`, whose
  // state now holds it.
  void ChunkDone(const std::string& incarnation, const v1::Tensor& latent) ABSL_LOCKS_EXCLUDED(mu_);
  // A chunk failed: whatever state the group holds may be half advanced,
  // so the next chunk replays.
  void StateLost() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t latent_frames_done() const ABSL_LOCKS_EXCLUDED(mu_);
  // Latent frames the last StepOn replayed (0: none).
  int64_t last_replayed() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t history_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int64_t id_;
  const std::string public_id_;
  const std::string group_;
  const v1::Mode mode_;
  std::atomic<int64_t> state_bytes_per_rank_;
  const int64_t max_history_bytes_;

  mutable absl::Mutex mu_;
  std::string holder_ ABSL_GUARDED_BY(mu_);  // the incarnation holding the state; "" none
  std::vector<v1::Tensor> history_ ABSL_GUARDED_BY(mu_);
  int64_t history_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool history_complete_ ABSL_GUARDED_BY(mu_) = true;  // false once past max_history_bytes
  int64_t latent_frames_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_replayed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Latents [B, C, t_i, H, W] (one dtype, B, C, H, W) joined along their
// frames, as raw bytes in C order.
v1::Tensor ConcatFrames(const std::vector<v1::Tensor>& chunks);

}  // namespace vaedecode::server
