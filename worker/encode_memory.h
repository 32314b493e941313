#pragma once

// How much memory an encode needs, for the leader's choice before anything
// runs: exact when every rank has room for its band, dense when the leader
// has room for the whole image, else RESOURCE_EXHAUSTED with the numbers.
//
// A rank's peak, for one batch entry and one frame, is measured on the real
// encoder (dense, on the leader's device) at three square sizes and fitted
// as
//     fixed + bytes_per_pixel · q + bytes_per_pixel_pair · q · k
// where q are the pixels whose activations the rank holds (its band with a
// halo row each side, or the whole image) and k every pixel (the mid-block
// attention's keys, gathered whole in exact mode). Batch entries multiply
// it; a clip's frames multiply what grows with the image by
// 1 + frame_growth · (frames − 1) / temporal_factor, frame_growth measured
// on a clip of 1 + temporal_factor frames. kHeadroom (tiling) on
// top, as for decodes. Clips encoded as whole clips one at a time
// (EncoderInfo::clip_frames, MiniMax-H3) cost one clip; every other family
// is taken to grow linearly with frames
// (measured: Wan's chunked encode does too, for what it keeps of every
// chunk), which overstates the windowed encoders' (HunyuanVideo, MiniMax-H3)
// long clips. Attention kernels that stop holding whole score matrices at
// larger sizes make the quadratic term an overstatement too: refusals err
// on the side of never running out.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "tiling/calibration.h"
#include "worker/group_encode.h"

namespace vaedecode::worker {

struct EncodePeakModel {
  double fixed_bytes = 0;
  double bytes_per_pixel = 0;
  double bytes_per_pixel_pair = 0;
  double frame_growth = 0;  // per temporal_factor frames beyond the first
};

// Measures `encoder` through `probe` (several dense encodes of seeded
// images; a few hundred milliseconds on a CPU for the fixtures' models).
absl::StatusOr<EncodePeakModel> CalibrateEncodePeak(families::Encoder& encoder, const tiling::PeakProbe& probe);

// The peak of one rank encoding `query_rows` of the rows of an image of
// `image_shape` ([B, C, (T,) H, W]), with kHeadroom.
int64_t PredictEncodePeak(const families::Encoder& encoder, const EncodePeakModel& model,
                          const std::vector<int64_t>& image_shape, int64_t query_rows);

// The rows the busiest rank holds in an exact encode over `world_size`
// ranks: its band at the input level (the first bands take the remainder)
// and a halo row each side.
int64_t ExactBandRows(const families::Encoder& encoder, int64_t image_rows, int world_size);

// OK when `plan` fits `free_bytes_per_rank` (−1: a rank without a bound);
// RESOURCE_EXHAUSTED naming what it needs and what is free otherwise.
absl::Status CheckEncodeFits(const families::Encoder& encoder, const EncodePeakModel& model, const EncodePlan& plan,
                             const std::vector<int64_t>& free_bytes_per_rank, int world_size);

}  // namespace vaedecode::worker
