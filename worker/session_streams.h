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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "families/decoder.h"
#include "worker/decode_plan.h"

namespace vaedecode::worker {

// The bytes of `decoder`'s session state per latent of B x H x W, measured
// by streaming one-frame chunks of a small zero latent, three or past the
// output frame table (a state holds a few frames of each causal layer's
// input, or a window's latents and its faded overlap, all proportional to
// the area); 0 for a decoder that does not stream.
double MeasureSessionStateBytesPerLatent(families::Decoder& decoder);

class SessionStreams {
 public:
  // Whether `plan`'s chunk (of model `model_index`) may continue its
  // session here: OK for a start; FAILED_PRECONDITION when no state is held
  // (the caller replays the session's history); INVALID_ARGUMENT for a
  // chunk whose model, mode, batch, channels, size or dtype differ from the
  // session's first chunk (its state would not fit it). The leader asks
  // before the chunk is broadcast, so a refusal leaves the group in step.
  absl::Status Check(const DecodePlan& plan, int64_t model_index) const ABSL_LOCKS_EXCLUDED(mu_);
  // The stream `plan`'s chunk decodes through: a fresh one for a start
  // (replacing any the session held, and recording what its chunks must
  // keep), else the one held, after Check.
  absl::StatusOr<families::DecodeStream*> Step(const DecodePlan& plan, int64_t model_index, families::Decoder& decoder)
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
    DecodeMode mode = DecodeMode::kDense;
    std::vector<int64_t> chunk_shape;  // the latent's, frames set to 0
    at::ScalarType dtype = at::kFloat;
    std::unique_ptr<families::DecodeStream> stream;
    int64_t latent_frames = 0;  // recorded after each chunk
    int64_t state_bytes = 0;
  };
  mutable absl::Mutex mu_;
  std::map<int64_t, Held> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace vaedecode::worker
