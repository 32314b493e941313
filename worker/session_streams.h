#pragma once

// One rank's streaming sessions: the DecodeStream of each session whose
// chunks this rank decodes (the leader's in dense mode; every rank's band in
// exact mode), by session id. A session's state lives here between its
// chunks, which are ordinary jobs: sessions interleave with each other and
// with whole decodes on the same group.
//
// Threading: Step, Finish and Drop run on the thread that runs the group's
// jobs (the leader's under its step lock; a peer has one thread); the
// figures (LatentFrames, StateBytes, TotalBytes, size) may be read from any
// thread: they are recorded after each chunk, never read from a stream a
// job is using.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "families/decoder.h"
#include "worker/decode_plan.h"

namespace vaedecode::worker {

class SessionStreams {
 public:
  // The stream `step`'s chunk of model `model_index` decodes through: a
  // fresh one for a start (replacing any the session held), else the one
  // held. FAILED_PRECONDITION when none is held (the caller replays the
  // session's history) or the decoder cannot stream; INVALID_ARGUMENT for
  // a chunk of another model than the session's.
  absl::StatusOr<families::DecodeStream*> Step(const SessionStep& step, int64_t model_index, families::Decoder& decoder)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After a chunk: records the session's figures (ok), or drops its state,
  // which a failed chunk may have left half advanced.
  void Finish(int64_t id, bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees session `id`'s state (a no-op when none is held).
  void Drop(int64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Latent frames session `id`'s state has seen; nullopt when none is held.
  std::optional<int64_t> LatentFrames(int64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes session `id`'s state holds (0 when none), and all sessions'.
  int64_t StateBytes(int64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t TotalBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Held {
    int64_t model_index = 0;
    std::unique_ptr<families::DecodeStream> stream;
    int64_t latent_frames = 0;  // recorded after each chunk
    int64_t state_bytes = 0;
  };
  mutable absl::Mutex mu_;
  std::map<int64_t, Held> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vaedecode::worker
