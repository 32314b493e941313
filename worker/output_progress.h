#pragma once

// What the leader learns of the output before a decode ends, so it can stream
// it early: pixel rows of a single image that are final (tiled rounds, the
// leader's own exact band) and whole frames of a video (decoders that finish
// frames in order: Wan's causal chunks). The executor (group_decode.h) calls
// these on the leader only, on the decode's thread.

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace vaedecode::worker {

// `sample`'s first `final_rows` pixel rows are final: the blended output so
// far (tiled), or the leader's own band (exact; rows below it are not there).
using RowsReady = std::function<void(const at::Tensor& sample, int64_t final_rows)>;

// `frames` ([B, C, t, H, W], whole rows) are the output's frames
// [first_frame, first_frame + t).
using FramesReady = std::function<void(const at::Tensor& frames, int64_t first_frame)>;

struct OutputProgress {
  RowsReady rows_ready;
  FramesReady frames_ready;
};

}  // namespace vaedecode::worker
