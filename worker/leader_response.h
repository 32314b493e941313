#pragma once

// Writes the response stream of one leader Run call, as the public API's
// Decode streams it: the Header, the Chunks and the Trailer. The header goes
// first (the output shape is known from the plan), then what is final before
// the decode ends: a single image's row bands as no later tile touches them
// (tiled) or the leader's own band (exact), a video's frames as a
// frame-by-frame decoder finishes them (dense and exact, one batch entry,
// not MP4); the rest streams after the decode.
//
// The decode thread (and the tiled decode's rows-ready callback, which runs
// on it) calls it; the messages are encoded and written on a writer thread
// of its own, in order, so the decode goes on meanwhile: what streams during
// the decode is handed over as a device::HostCopy (on a GPU a copy to pinned
// memory that does not wait for the device to drain). At most
// kMaxQueuedBytes of output wait for the writer; beyond that the decode
// thread waits (a slow reader slows the decode, never grows memory).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "vaedecode/v1/vaedecode.pb.h"
#include "worker/decode_plan.h"
#include "worker/group_runtime.h"
#include "worker/output_progress.h"
#include "worker/output_stream.h"

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
  static constexpr int64_t kMaxQueuedBytes = int64_t{256} << 20;

  // `out_shape`: the sample's shape (NCHW / NCTHW); `dtype_note`: why the
  // model decodes in another dtype than asked ("" when it does not);
  // `pixels`: the model's pixel convention (ModelInfo::pixels);
  // `sample_rate`: an audio VAE's (ModelInfo::sample_rate), for a waveform's
  // header and WAV files.
  LeaderResponse(ResponseSink& sink, const v1::DecodeRequest& request, int64_t max_chunk_bytes,
                 std::vector<int64_t> out_shape, std::string dtype_note, const families::PixelConvention& pixels = {},
                 int64_t sample_rate = 0);
  // Waits for the writer (Finish normally has).
  // An audio track (a waveform [B, channels, samples] on the CPU at
  // `sample_rate`) muxed into each batch entry's MP4; before any output.
  void MuxAudio(at::Tensor waveform, int64_t sample_rate);

  ~LeaderResponse();

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
  class Writer;

  // Queues the header (once); false when the stream is over.
  bool QueueHeader(DecodeMode mode, const std::string& reason, const std::string& tile_plan, int degree,
                   const DecodePlan& plan);
  // The header from the plan, before the decode ends; false when the stream is over.
  bool EnsureHeader(const DecodePlan& plan);
  // Rows [streamed_rows_, final_rows) of `sample`.
  void StreamRows(const at::Tensor& sample, int64_t final_rows);
  // Frames [streamed_frames_, ...) of `frames` (whose first is `first_frame`).
  void StreamFrames(const at::Tensor& frames, int64_t first_frame);
  // Queues the chunks of `part` (its rows from `first_row`, its frames from
  // `first_frame` of the output), copied to the host without waiting.
  void QueueChunks(const at::Tensor& part, int64_t first_row, int64_t first_frame);
  // On the writer thread.
  bool WriteChunk(v1::Chunk&& chunk, int64_t first_row, int64_t first_frame);
  // Whether the caller went away or the stream failed (any thread).
  bool over() const;

  ResponseSink& sink_;
  const v1::DecodeRequest& request_;
  OutputEncoding encoding_;  // MuxAudio adds the audio before any output
  const int64_t max_chunk_bytes_;
  const std::vector<int64_t> out_shape_;
  const std::string dtype_note_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  // Decode thread only.
  bool header_queued_ = false;
  int64_t streamed_rows_ = 0;
  int64_t streamed_frames_ = 0;
  // Written by the writer thread, read by both.
  mutable absl::Mutex mu_;
  bool caller_gone_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status stream_status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Writer> writer_;  // last: stops first
};

}  // namespace vaedecode::worker
