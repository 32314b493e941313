#pragma once

// How one decode runs on a group, decided once by the leader (the service's
// LeaderService, the CLI's leader) before the job is broadcast: the mode, the
// prepared VAE-space latent and, for tiled decodes, the tiles. Peers rebuild
// the same plan from the job header (group_job.h); the executor
// (group_decode.h) runs it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "tiling/calibration.h"
#include "tiling/planner.h"
#include "vaedecode/v1/vaedecode.pb.h"
#include "worker/decode_job.h"

namespace vaedecode::worker {

// The rank that plans every job and answers for the group.
inline constexpr int kLeader = 0;

enum class DecodeMode : int64_t {
  kDense = 0,  // the leader decodes the whole latent; the peers wait
  kExact = 1,  // every rank decodes its row band exactly
  kTiled = 2,  // every rank decodes whole seam-free tiles; the leader blends
};

// "dense", "exact", "tiled": for logs, the CLI's summary and headers' reasons.
const char* ModeName(DecodeMode mode);

// The mode to plan for a request's (or the scheduler's) v1::Mode: DENSE and
// TILED as named; EXACT and AUTO exact, which PlanDecode turns into dense
// where the decoder cannot shard.
DecodeMode PlannedMode(v1::Mode mode);

// Tiles as the job header carries them: every rank rebuilds the same
// tiling::TilePlan from these (PlanFromHeader).
struct TileShape {
  int64_t rows = 0;  // tile size in latents
  int64_t cols = 0;
  bool stock = false;  // diffusers' stock layout instead of seam-free tiles
};

// A chunk of a streaming session (worker/session_streams.h): every rank
// that decodes it runs it through the session's DecodeStream, which carries
// the causal state from the session's earlier chunks.
struct SessionStep {
  int64_t id = 0;      // 0: not a session's chunk
  bool start = false;  // the session's state begins afresh (its first chunk, or a replay)
  bool ends = false;   // the chunk ends the clip (DecodeStream::DecodeChunk's clip_ends)
  // A replay (the state was lost with a rebuilt group): the latent is the
  // session's history and then its new chunk; the output of these leading
  // latent frames is decoded to rebuild the state and not returned.
  int64_t replayed_latent_frames = 0;  // leader only
};

struct DecodePlan {
  DecodeMode mode = DecodeMode::kDense;
  std::string reason;  // why this mode and size: the header's mode_reason (leader only)
  at::Tensor latent;   // PreparedLatent::z: VAE space, the decoder's dtype, its device
  families::DecodeConditioning conditioning;
  std::optional<uint64_t> noise_seed;  // the decode noise's seed, when mixed in (leader only)
  TileShape tile_shape;                // kTiled
  tiling::TilePlan tiles;              // kTiled: the leader's plan with its estimate (peers: rebuilt from tile_shape)
  int64_t budget_bytes = -1;           // kTiled: what one tile may use (leader; -1: unbounded)
  int64_t floor_tile_bytes = 0;        // kTiled: a floor tile's estimated peak (leader)
  // kExact: convolutions compute what needs no halo while it travels
  // (ShardedLayerOps::set_overlap_halo); off only to measure the overlap.
  bool overlap_halo = true;
  int world_size = 1;
  SessionStep session;
};

// What the plan is made against.
struct PlanningContext {
  // The mode asked for: kExact shards when the latent can be sharded over
  // the group and falls back to dense (with the reason) otherwise; kTiled
  // sizes tiles for the tightest rank.
  DecodeMode requested = DecodeMode::kExact;
  int world_size = 1;
  // kTiled: the model's measured peaks and every rank's free bytes (-1:
  // unbounded). Without a profile tiles are sized by FamilyGeometry's
  // default per-latent cost.
  const tiling::PeakProfile* profile = nullptr;
  std::vector<int64_t> free_bytes_per_rank;
};

// Validates and prepares the latent (PrepareLatent) and decides the mode.
// INVALID_ARGUMENT for a latent the model cannot take; RESOURCE_EXHAUSTED
// for a tiled decode whose smallest tiles are predicted not to fit the
// tightest rank's free memory (refused before anything is decoded).
absl::StatusOr<DecodePlan> PlanDecode(const families::Decoder& decoder, const DecodeJob& job,
                                      const PlanningContext& context);

// The tiles every rank decodes for a tiled plan: seam-free tiles of
// `shape`, or the stock layout.
tiling::TilePlan PlanFromHeader(const families::Decoder& decoder, int64_t rows, int64_t cols, const TileShape& shape);

// "RxC tiles of AxB latents over N rank(s)", for headers, trailers and logs.
std::string DescribePlan(const tiling::TilePlan& plan, int world_size);

// The bytes of the float32 output a decode of `latent` produces: what the
// leader holds while it gathers or blends.
int64_t OutputBytes(const families::Decoder& decoder, const at::Tensor& latent);

}  // namespace vaedecode::worker
