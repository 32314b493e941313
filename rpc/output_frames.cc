#include "rpc/output_frames.h"

#include <algorithm>

namespace vaedecode::rpc {

int64_t OutputFrames(const OutputFrameTable& table, int64_t temporal_factor, int64_t latent_frames) {
  const int64_t size = static_cast<int64_t>(table.frames.size());
  if (size == 0 || table.period <= 0) {
    return latent_frames <= 0 ? 0 : 1 + std::max<int64_t>(1, temporal_factor) * (latent_frames - 1);
  }
  if (latent_frames < size) return table.frames[std::max<int64_t>(0, latent_frames)];
  // Step back whole periods into the table's last `period` entries.
  const int64_t periods = (latent_frames - size) / table.period + 1;
  return table.frames[latent_frames - periods * table.period] + periods * table.frames_per_period;
}

}  // namespace vaedecode::rpc
