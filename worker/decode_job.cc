#include "worker/decode_job.h"

#include <exception>
#include <new>
#include <random>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "families/posterior.h"
#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

absl::StatusOr<PreparedLatent> PrepareLatent(const families::Decoder& decoder, const DecodeJob& job) {
  RETURN_IF_ERROR(job.session_chunk ? decoder.ValidateChunk(job.latent)
                                    : decoder.ValidateLatentFor(job.latent, job.conditioning));
  PreparedLatent out;
  RETURN_IF_ERROR(CatchExceptions("latent conversion", [&] {
    at::Tensor z = job.latent;
    // The noise is mixed into the latent as sent, before any de-normalisation.
    if (job.noise_scale != 0) {
      out.noise_seed = job.noise_seed ? *job.noise_seed : std::random_device{}();
      const at::Tensor noise = families::SeededNoise(z.sizes(), *out.noise_seed);
      z = (1 - job.noise_scale) * z.to(at::kCPU).to(at::kFloat) + job.noise_scale * noise;
    }
    z = z.to(decoder.device());
    if (job.scaling_factor) {
      // float32, as diffusers computes it.
      z = z.to(at::kFloat) / *job.scaling_factor;
      if (job.shift_factor) z = z + *job.shift_factor;
    } else if (job.latent_space == families::LatentSpace::kRaw) {
      z = decoder.ToVaeSpace(z.to(at::kFloat));
    }
    out.z = z.to(decoder.dtype()).contiguous();
  }));
  return out;
}

absl::StatusOr<at::Tensor> DecodePrepared(families::Decoder& decoder, const at::Tensor& z,
                                          const families::DecodeConditioning& conditioning, families::LayerOps& ops,
                                          families::DecodeStream* stream, bool clip_ends) {
  at::Tensor sample;
  RETURN_IF_ERROR(CatchExceptions("decode", [&] {
    sample = stream != nullptr ? stream->DecodeChunk(z, ops, clip_ends) : decoder.Decode(z, ops, conditioning);
  }));
  return sample;
}

absl::StatusOr<at::Tensor> RunDecode(families::Decoder& decoder, const DecodeJob& job, families::LayerOps& ops) {
  ASSIGN_OR_RETURN(PreparedLatent prepared, PrepareLatent(decoder, job));
  return DecodePrepared(decoder, prepared.z, job.conditioning, ops);
}

namespace {
constexpr char kInStepPayload[] = "type.vaedecode/in-step";
constexpr char kLeaderOnlyPayload[] = "type.vaedecode/leader-only";
}  // namespace

absl::Status InStep(absl::Status status) {
  if (!status.ok()) status.SetPayload(kInStepPayload, absl::Cord("1"));
  return status;
}

bool IsInStep(const absl::Status& status) { return status.GetPayload(kInStepPayload).has_value(); }

absl::Status LeaderOnly(absl::Status status) {
  if (!status.ok()) status.SetPayload(kLeaderOnlyPayload, absl::Cord("1"));
  return status;
}

bool IsLeaderOnly(const absl::Status& status) { return status.GetPayload(kLeaderOnlyPayload).has_value(); }

}  // namespace vaedecode::worker
