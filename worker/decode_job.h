#pragma once

// One decode's input as a caller sends it, the one conversion of that input
// into the decoder's VAE-space latent, and the single place where
// LibTorch's c10::Error (and any other exception) is turned into an
// absl::Status, so nothing throws past a worker, the CLI or a process
// boundary.

#include <functional>
#include <optional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/layer_ops.h"
#include "families/status_error.h"

namespace vaedecode::worker {

struct DecodeJob {
  at::Tensor latent;  // NCHW or NCTHW, any float dtype; any device (moved to the decoder's)
  families::LatentSpace latent_space = families::LatentSpace::kVae;
  families::DecodeConditioning conditioning;  // the decode timestep (LTX)
  // The caller's own de-normalisation of a raw latent (remote_decode's
  // scaling_factor / shift_factor), in place of the family's: z / scale + shift.
  std::optional<double> scaling_factor;
  std::optional<double> shift_factor;
  // LTX2Pipeline's decode noise: (1 - scale) · latent + scale · N(0, 1), the
  // noise from LibTorch's CPU generator seeded with noise_seed (a random
  // seed when unset). 0: none.
  double noise_scale = 0;
  std::optional<uint64_t> noise_seed;
  // A streaming session's chunk: checked as one (Decoder::ValidateChunk), as
  // it may be shorter than the shortest clip.
  bool session_chunk = false;
};

// A job's latent as the decoder takes it: validated, noise mixed in,
// de-normalised, in VAE space and the decoder's dtype, contiguous on its
// device. Every decode mode starts from this tensor, made once.
struct PreparedLatent {
  at::Tensor z;
  std::optional<uint64_t> noise_seed;  // the seed used, when noise was mixed in
};

// INVALID_ARGUMENT for a latent the model cannot take; the conversion's
// errors otherwise.
absl::StatusOr<PreparedLatent> PrepareLatent(const families::Decoder& decoder, const DecodeJob& job);

// Decodes a prepared latent through `ops`: RESOURCE_EXHAUSTED when memory
// runs out, INTERNAL for other failures. With a `stream` (a session's, made
// by decoder.OpenStream) the latent is the clip's next chunk, decoded
// through it, its last when `clip_ends`.
absl::StatusOr<at::Tensor> DecodePrepared(families::Decoder& decoder, const at::Tensor& z,
                                          const families::DecodeConditioning& conditioning, families::LayerOps& ops,
                                          families::DecodeStream* stream = nullptr, bool clip_ends = false);

// PrepareLatent, then DecodePrepared: one dense decode of a job.
absl::StatusOr<at::Tensor> RunDecode(families::Decoder& decoder, const DecodeJob& job, families::LayerOps& ops);

using families::CatchExceptions;

// Marks an error every rank of the group returns together, at the same step
// (so the group can serve the next job), and tells it apart from one rank's
// failure. A status payload: it survives copies, not a trip over gRPC.
absl::Status InStep(absl::Status status);
bool IsInStep(const absl::Status& status);

// Marks an error only the leader saw while the peers went on (a dense decode
// runs on the leader alone): the leader must still meet the peers at the
// job's closing collective.
absl::Status LeaderOnly(absl::Status status);
bool IsLeaderOnly(const absl::Status& status);

}  // namespace vaedecode::worker
