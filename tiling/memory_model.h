#pragma once

// The one memory model every decision about a decode's memory goes through:
// the scheduler's mode choice (server/mode_selection), the tile planner
// (tiling/planner), the group leader's and the CLI's tile budgets. Pure
// arithmetic, torch-free, so the server uses it without LibTorch.
//
// A decode's peak is the larger of two phases (measured by
// tiling/calibration.h on one batch entry and one latent frame):
//   convolutions:  fixed + n · bytes_per_latent · queries
//   attention:     attention_fixed + n · (attention_bytes_per_latent · queries
//                  + attention_bytes_per_latent_pair · queries · keys)
// where queries are the latents decoded (a tile, a band or the whole latent),
// keys the latents attention sees (the whole image in exact mode: every
// rank holds all keys), and n = batch × FrameFactor, with kHeadroom on what
// grows with the region.

#include <cstdint>
#include <vector>

namespace vaedecode::tiling {

inline constexpr int64_t kFloorTile = 32;  // the smallest tile side, in latents
inline constexpr double kHeadroom = 1.25;  // on measured peaks

// Measured costs of one batch entry and one latent frame (calibration.h).
struct PeakCosts {
  double fixed_bytes = 0;
  double bytes_per_latent = 0;
  double attention_fixed_bytes = 0;
  double attention_bytes_per_latent = 0;
  double attention_bytes_per_latent_pair = 0;
};

struct MemoryModel {
  PeakCosts costs;
  int64_t temporal_factor = 1;
  // Latent frames the decoder holds at once (families::ModelInfo): 1 for
  // images and frame-by-frame decoders (Wan), a temporal window
  // (HunyuanVideo), 0 for the whole clip (LTX-2).
  int64_t peak_latent_frames = 1;
};

// A VAE-space latent's extent (a packed raw latent is unpacked first).
struct LatentExtent {
  int64_t batch = 1;
  int64_t frames = 1;  // latent frames; 1 for images
  int64_t rows = 0;
  int64_t cols = 0;
};

// How many one-frame calibrations a decode of `latent_frames` costs at its
// peak: the output frames of the largest window the decoder holds (a causal
// VAE decodes T latent frames to 1 + temporal_factor·(T − 1); a later
// one-frame chunk to temporal_factor).
double FrameFactor(const MemoryModel& model, int64_t latent_frames);

// The peak of decoding `rows` x `cols` latents of `latent` (all its batch
// entries and frames) against `key_latents` attention keys, with `headroom`
// on what grows with the region (1.0: the prediction; kHeadroom: the plans').
int64_t RegionPeakBytes(const MemoryModel& model, const LatentExtent& latent, int64_t rows, int64_t cols,
                        int64_t key_latents, double headroom);

// With kHeadroom, keys = the region itself: a dense decode or one tile.
int64_t DensePeakBytes(const MemoryModel& model, const LatentExtent& latent);

// One rank of an exact decode over `degree` ranks: the thickest band (the
// first ranks take the remainder) plus a halo row on each side, queries
// against every key.
int64_t ExactRankPeakBytes(const MemoryModel& model, const LatentExtent& latent, int degree);

// One floor tile (kFloorTile latents a side, or the whole side when shorter).
int64_t FloorTilePeakBytes(const MemoryModel& model, const LatentExtent& latent);

// What one tile may use when every rank decodes whole tiles and the leader
// also holds the blended float32 output (`output_bytes`): the tightest
// measured rank's free bytes less the output, at least 0. Entries < 0 are
// unbounded ranks; with none measured, the budget is unbounded (kUnbounded).
inline constexpr int64_t kUnboundedBudget = INT64_MAX / 2;
int64_t TileBudgetBytes(const std::vector<int64_t>& free_bytes_per_rank, int64_t output_bytes);

}  // namespace vaedecode::tiling
