#include "worker/encode_memory.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_format.h"
#include "families/layer_ops.h"
#include "families/status_error.h"
#include "parallel/band_partition.h"
#include "rpc/status_macros.h"
#include "tiling/memory_model.h"
#include "worker/encode_job.h"

namespace vaedecode::worker {
namespace {

// The peak above what was live, of a dense encode of a seeded image.
absl::StatusOr<double> MeasureEncode(families::Encoder& encoder, const tiling::PeakProbe& probe,
                                     std::vector<int64_t> shape) {
  at::Tensor image;
  RETURN_IF_ERROR(families::CatchExceptions("calibration image", [&] {
    const at::Generator seeded = at::detail::createCPUGenerator(0);  // not the process's generator
    image = (at::rand(shape, seeded) * 2 - 1).to(encoder.device()).to(encoder.dtype());
  }));
  families::DenseOps dense;
  probe.reset_peak();
  const int64_t live = probe.current_bytes();
  RETURN_IF_ERROR(EncodePrepared(encoder, image, dense).status());
  return static_cast<double>(std::max<int64_t>(0, probe.peak_bytes() - live));
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

absl::StatusOr<EncodePeakModel> CalibrateEncodePeak(families::Encoder& encoder, const tiling::PeakProbe& probe) {
  const families::EncoderInfo& info = encoder.info();
  // Square images of 8, 16 and 24 latents a side (every class encodes
  // those): large enough for the mid-block attention's scores to show.
  std::vector<double> pixels, peaks;
  for (int64_t latents : {8, 16, 24}) {
    const int64_t side = latents * info.spatial_factor;
    std::vector<int64_t> shape = {1, info.in_channels, side, side};
    if (info.is_video) shape.insert(shape.begin() + 2, 1);
    ASSIGN_OR_RETURN(const double peak, MeasureEncode(encoder, probe, shape));
    pixels.push_back(static_cast<double>(side * side));
    peaks.push_back(peak);
  }
  // fixed + a·n + b·n² through the three points; b (attention's scores)
  // and a never negative, the fixed part taking what is left at the smallest.
  EncodePeakModel m;
  const double s01 = (peaks[1] - peaks[0]) / (pixels[1] - pixels[0]);
  const double s12 = (peaks[2] - peaks[1]) / (pixels[2] - pixels[1]);
  m.bytes_per_pixel_pair = std::max(0.0, (s12 - s01) / (pixels[2] - pixels[0]));
  m.bytes_per_pixel = std::max({0.0, s01 - m.bytes_per_pixel_pair * (pixels[0] + pixels[1]),
                                s12 - m.bytes_per_pixel_pair * (pixels[1] + pixels[2])});
  m.fixed_bytes =
      std::max(0.0, peaks[0] - m.bytes_per_pixel * pixels[0] - m.bytes_per_pixel_pair * pixels[0] * pixels[0]);
  if (info.is_video && info.temporal_factor > 1) {
    // At the middle size, where what grows with the image outweighs the fixed part.
    const int64_t side = 16 * info.spatial_factor;
    ASSIGN_OR_RETURN(const double clip,
                     MeasureEncode(encoder, probe, {1, info.in_channels, 1 + info.temporal_factor, side, side}));
    m.frame_growth = std::max(0.0, (clip - m.fixed_bytes) / std::max(1.0, peaks[1] - m.fixed_bytes) - 1.0);
  }
  return m;
}

int64_t ExactBandRows(const families::Encoder& encoder, int64_t image_rows, int world_size) {
  const std::vector<families::RowLevel> levels = encoder.RowLevels(image_rows);
  const int64_t per = levels.front().per_latent_row;
  int64_t widest = 0;
  for (const parallel::Band& b : parallel::PartitionRows(levels.back().rows, world_size)) {
    // The last band runs to the level's end (the rows a floor leaves).
    const int64_t end = b.end == levels.back().rows ? image_rows : b.end * per;
    widest = std::max(widest, end - b.begin * per);
  }
  return std::min(image_rows, widest + 2);
}

int64_t PredictEncodePeak(const families::Encoder& encoder, const EncodePeakModel& m, const std::vector<int64_t>& shape,
                          int64_t query_rows) {
  const families::EncoderInfo& info = encoder.info();
  const double rows = static_cast<double>(shape[shape.size() - 2]);
  const double cols = static_cast<double>(shape.back());
  const double queries = static_cast<double>(query_rows) * cols;
  const double keys = rows * cols;
  double frame_scale = 1.0;
  if (info.is_video && shape.size() == 5 && info.temporal_factor > 0) {
    // A clip encoded as whole clips one at a time holds one, as the
    // calibration clip (1 + temporal_factor frames, padded to one) did.
    const int64_t frames = info.clip_frames > 0 && shape[2] > 1 ? 1 + info.temporal_factor : shape[2];
    frame_scale += m.frame_growth * static_cast<double>(frames - 1) / static_cast<double>(info.temporal_factor);
  }
  const double grows = (m.bytes_per_pixel * queries + m.bytes_per_pixel_pair * queries * keys) * frame_scale;
  return static_cast<int64_t>((m.fixed_bytes + tiling::kHeadroom * grows) * static_cast<double>(shape[0]));
}

absl::Status CheckEncodeFits(const families::Encoder& encoder, const EncodePeakModel& model, const EncodePlan& plan,
                             const std::vector<int64_t>& free_bytes_per_rank, int world_size) {
  const std::vector<int64_t> shape = plan.image.sizes().vec();
  const int64_t rows = shape[shape.size() - 2];
  const int64_t dense = PredictEncodePeak(encoder, model, shape, rows);
  if (plan.mode == DecodeMode::kExact) {
    const int64_t per_rank = PredictEncodePeak(encoder, model, shape, ExactBandRows(encoder, rows, world_size));
    for (size_t r = 0; r < free_bytes_per_rank.size(); ++r) {
      const int64_t free = free_bytes_per_rank[r];
      if (free < 0 || per_rank <= free) continue;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the encode would run out of memory, so nothing was encoded: exact over %d ranks needs about %.1f MiB "
          "per rank and rank %d has %.1f MiB free (the whole encode on one rank: about %.1f MiB)",
          world_size, MiB(per_rank), static_cast<int>(r), MiB(free), MiB(dense)));
    }
    return absl::OkStatus();
  }
  const int64_t free = free_bytes_per_rank.empty() ? -1 : free_bytes_per_rank[0];
  if (free >= 0 && dense > free) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the encode would run out of memory, so nothing was encoded: dense (%s) needs about %.1f MiB and the "
        "leader has %.1f MiB free%s",
        plan.reason.empty() ? "asked for" : plan.reason, MiB(dense), MiB(free),
        world_size > 1 ? "; an exact encode over the group would need less per rank" : ""));
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::worker
