#pragma once

// Writes the response stream of one leader Run call, as the public API's
// Decode streams it: the Header, the Chunks and the Trailer. The header goes
// first (the output shape is known from the plan), then what is final before
// the decode ends: a single image's row bands as no later tile touches them
// (tiled) or the leader's own band (exact), a video's frames as a
// frame-by-frame decoder finishes them (dense and exact, one batch entry,
// not MP4); the rest streams after the decode.
//
// Not thread-safe: the Run call's decode thread (and the tiled decode's
// rows-ready callback, which runs on it) use it.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "vaedecode/v1/vaedecode.pb.h"
#include "worker/decode_plan.h"
#include "worker/group_runtime.h"
#include "worker/output_progress.h"

namespace vaedecode::worker {

// Where a Run call's messages go (the leader's callback reactor).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // Blocks until `message` is written; false when the caller is gone.
  virtual bool Write(const v1::DecodeResponse& message) = 0;
  // The caller cancelled or went away.
  virtual bool cancelled() const = 0;
};

class LeaderResponse {
 public:
  // `out_shape`: the sample's shape (NCHW / NCTHW); `dtype_note`: why the
  // model decodes in another dtype than asked ("" when it does not).
  LeaderResponse(ResponseSink& sink, const v1::DecodeRequest& request, int64_t max_chunk_bytes,
                 std::vector<int64_t> out_shape, std::string dtype_note);

  // Whether `plan` streams row bands (RowsDuringDecode) or frames
  // (FramesDuringDecode) while it decodes.
  bool StreamsRows(const DecodePlan& plan) const;
  bool StreamsFrames(const DecodePlan& plan) const;
  // The callbacks the executor calls for those (OutputProgress); empty
  // where the plan streams neither.
  OutputProgress Progress(const DecodePlan& plan);
  // The header (once), then rows [streamed, final_rows) of `sample`.
  void RowsDuringDecode(const DecodePlan& plan, const at::Tensor& sample, int64_t final_rows);
  // The header (once), then `frames`, the output's frames from `first_frame`.
  void FramesDuringDecode(const DecodePlan& plan, const at::Tensor& frames, int64_t first_frame);
  // After the decode: the header if not sent yet, the remaining chunks, the
  // trailer. CANCELLED when the caller went away.
  absl::Status Finish(const DecodePlan& plan, const DecodeOutcome& outcome, int world_size);

 private:
  bool WriteHeader(DecodeMode mode, const std::string& reason, const std::string& tile_plan, int degree,
                   const DecodePlan& plan);
  // The header from the plan, before the decode ends; false when the stream is over.
  bool EnsureHeader(const DecodePlan& plan);
  // Rows [streamed_rows_, final_rows) of `sample`.
  void StreamRows(const at::Tensor& sample, int64_t final_rows);
  // Frames [streamed_frames_, ...) of `frames` (whose first is `first_frame`).
  void StreamFrames(const at::Tensor& frames, int64_t first_frame);
  bool WriteChunk(v1::Chunk&& chunk, int64_t first_row, int64_t first_frame);

  ResponseSink& sink_;
  const v1::DecodeRequest& request_;
  const int64_t max_chunk_bytes_;
  const std::vector<int64_t> out_shape_;
  const std::string dtype_note_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool header_sent_ = false;
  bool caller_gone_ = false;
  int64_t streamed_rows_ = 0;
  int64_t streamed_frames_ = 0;
  absl::Status stream_status_;
};

}  // namespace vaedecode::worker
