#pragma once

// What the frontend checks of a DecodeSession before anything runs: the
// open against its model (as a Decode of the same latent would be checked,
// for the frames one chunk may return, plus what a session needs), and each
// chunk against the open; and
// the DecodeRequest a chunk becomes. Pure functions (thread-safe), fuzzed
// with the request bytes a client sends (server/session_request_fuzzer.cc).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/request_validation.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// What an accepted open decides.
struct SessionPlan {
  v1::Mode mode = v1::MODE_DENSE;  // every chunk's: DENSE or EXACT
  std::string mode_reason;
  // The state admission counts on each rank that holds it (the model's
  // measured bytes per latent × B × H × W, shared by an exact session's
  // ranks).
  int64_t state_bytes_per_rank = 0;
  // A one-latent-frame chunk's estimated decode peak per rank in `mode`
  // (the memory model, server/mode_selection.h), for a window of latents
  // where the model decodes windows (peak_latent_frames).
  int64_t chunk_peak_bytes = 0;
};

// FAILED_PRECONDITION for a model that cannot stream (with its reason);
// INVALID_ARGUMENT naming the field for a shape other than [B, C, H, W]
// with sane dimensions, MP4 output, tiled mode, or anything a one-frame
// Decode of that latent would be refused for (ValidateDecodeRequest), or a
// Decode returning the most frames one chunk returns (session_chunk_frames;
// CheckAdmission: --max_output_pixels). RESOURCE_EXHAUSTED when one latent
// frame is more than `max_chunk_bytes` (no chunk could carry it; the
// checks' one-frame latent is never larger). AUTO is exact on a group of more than one rank when the
// model shards, else dense.
absl::StatusOr<SessionPlan> ValidateSessionOpen(const v1::SessionOpen& open, const v1::ModelInfo& model, int group_size,
                                                const AdmissionLimits& limits, int64_t max_chunk_bytes);

// INVALID_ARGUMENT unless `chunk` is [B, C, t, H, W] with t >= 1 in the
// open's dtype, B, C, H and W (its bytes are the Decode's checks).
absl::Status ValidateSessionChunk(const v1::SessionOpen& open, const v1::Tensor& chunk);

// The Decode request of chunk `index` of the session `open` opened, in
// `mode`, without its latent (the caller moves the chunk in).
v1::DecodeRequest SessionChunkRequest(const v1::SessionOpen& open, v1::Mode mode, int64_t index);

}  // namespace vaedecode::server
