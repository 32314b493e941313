#include "tiling/memory_model.h"

#include <algorithm>
#include <cmath>

namespace vaedecode::tiling {

double FrameFactor(const MemoryModel& model, int64_t latent_frames) {
  const int64_t frames = std::max<int64_t>(1, latent_frames);
  const int64_t window = model.peak_latent_frames <= 0 ? frames : std::min(frames, model.peak_latent_frames);
  const double tf = static_cast<double>(std::max<int64_t>(1, model.temporal_factor));
  if (window == 1) return frames > 1 ? tf : 1.0;
  return 1.0 + tf * static_cast<double>(window - 1);
}

int64_t RegionPeakBytes(const MemoryModel& model, const LatentExtent& latent, int64_t rows, int64_t cols,
                        int64_t key_latents, double headroom) {
  const PeakCosts& c = model.costs;
  const double n = static_cast<double>(std::max<int64_t>(1, latent.batch)) * FrameFactor(model, latent.frames);
  const double queries = static_cast<double>(rows) * static_cast<double>(cols);
  const double keys = static_cast<double>(key_latents);
  const double convolutions = c.fixed_bytes + std::ceil(n * c.bytes_per_latent * queries * headroom);
  const double scores = c.attention_bytes_per_latent_pair * queries * keys;
  const double attention =
      c.attention_fixed_bytes + std::ceil(n * (c.attention_bytes_per_latent * queries + scores) * headroom);
  return static_cast<int64_t>(std::max(convolutions, attention));
}

int64_t DensePeakBytes(const MemoryModel& model, const LatentExtent& latent) {
  return RegionPeakBytes(model, latent, latent.rows, latent.cols, latent.rows * latent.cols, kHeadroom);
}

int64_t ExactRankPeakBytes(const MemoryModel& model, const LatentExtent& latent, int degree) {
  const int64_t d = std::max(1, degree);
  const int64_t band = std::min(latent.rows, (latent.rows + d - 1) / d + 2);
  return RegionPeakBytes(model, latent, band, latent.cols, latent.rows * latent.cols, kHeadroom);
}

int64_t FloorTilePeakBytes(const MemoryModel& model, const LatentExtent& latent) {
  const int64_t rows = std::min(latent.rows, kFloorTile), cols = std::min(latent.cols, kFloorTile);
  return RegionPeakBytes(model, latent, rows, cols, rows * cols, kHeadroom);
}

int64_t TileBudgetBytes(const std::vector<int64_t>& free_bytes_per_rank, int64_t output_bytes) {
  int64_t tightest = -1;
  for (int64_t free : free_bytes_per_rank) {
    if (free >= 0) tightest = tightest < 0 ? free : std::min(tightest, free);
  }
  if (tightest < 0) return kUnboundedBudget;
  return std::max<int64_t>(0, tightest - output_bytes);
}

}  // namespace vaedecode::tiling
