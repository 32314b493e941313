#include "worker/leader_response.h"

#include <chrono>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "rpc/log_field.h"
#include "worker/output_stream.h"

namespace vaedecode::worker {
namespace {

v1::Mode ProtoMode(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kExact:
      return v1::MODE_EXACT;
    case DecodeMode::kTiled:
      return v1::MODE_TILED;
    case DecodeMode::kDense:
      break;
  }
  return v1::MODE_DENSE;
}

}  // namespace

LeaderResponse::LeaderResponse(ResponseSink& sink, const v1::DecodeRequest& request, int64_t max_chunk_bytes,
                               std::vector<int64_t> out_shape, std::string dtype_note)
    : sink_(sink),
      request_(request),
      max_chunk_bytes_(max_chunk_bytes),
      out_shape_(std::move(out_shape)),
      dtype_note_(std::move(dtype_note)) {}

bool LeaderResponse::StreamsRows(const DecodePlan& plan) const {
  const v1::OutputFormat f = request_.output_format();
  return (plan.mode == DecodeMode::kTiled || plan.mode == DecodeMode::kExact) && f != v1::OUTPUT_PNG &&
         f != v1::OUTPUT_JPEG && f != v1::OUTPUT_MP4 && out_shape_[0] == 1 &&
         (out_shape_.size() == 4 || out_shape_[2] == 1);
}

bool LeaderResponse::StreamsFrames(const DecodePlan& plan) const {
  // Chunks go batch entry by batch entry: a second entry's frames would wait
  // for the first's, so only one entry streams early. An MP4 needs every frame.
  return plan.mode != DecodeMode::kTiled && request_.output_format() != v1::OUTPUT_MP4 && out_shape_.size() == 5 &&
         out_shape_[0] == 1 && out_shape_[2] > 1;
}

OutputProgress LeaderResponse::Progress(const DecodePlan& plan) {
  OutputProgress progress;
  if (StreamsRows(plan)) {
    progress.rows_ready = [this, &plan](const at::Tensor& sample, int64_t final_rows) {
      RowsDuringDecode(plan, sample, final_rows);
    };
  }
  if (StreamsFrames(plan)) {
    progress.frames_ready = [this, &plan](const at::Tensor& frames, int64_t first_frame) {
      FramesDuringDecode(plan, frames, first_frame);
    };
  }
  return progress;
}

bool LeaderResponse::WriteHeader(DecodeMode mode, const std::string& reason, const std::string& tile_plan,
                                 int degree, const DecodePlan& plan) {
  v1::DecodeResponse message;
  v1::Header* header = message.mutable_header();
  header->set_request_id(request_.request_id());
  header->set_mode(ProtoMode(mode));
  header->set_degree(degree);
  // A force_upcast model says it decodes in float32, not the float16 asked for.
  header->set_mode_reason(dtype_note_.empty() ? reason : absl::StrCat(reason, "; ", dtype_note_));
  header->set_tile_plan(tile_plan);
  if (plan.noise_seed) header->set_noise_seed(*plan.noise_seed);
  if (absl::Status s = DescribeOutput(out_shape_, request_.output_format(), header); !s.ok()) {
    stream_status_ = s;
    return false;
  }
  header_sent_ = true;
  if (!sink_.Write(message)) caller_gone_ = true;
  return !caller_gone_;
}

bool LeaderResponse::EnsureHeader(const DecodePlan& plan) {
  if (header_sent_) return !caller_gone_ && stream_status_.ok();
  const std::string tile_plan = plan.mode == DecodeMode::kTiled ? DescribePlan(plan.tiles, plan.world_size) : "";
  return WriteHeader(plan.mode, plan.reason, tile_plan, plan.mode == DecodeMode::kDense ? 1 : plan.world_size, plan);
}

bool LeaderResponse::WriteChunk(v1::Chunk&& chunk, int64_t first_row, int64_t first_frame) {
  if (sink_.cancelled()) return false;
  chunk.set_row_begin(chunk.row_begin() + first_row);
  chunk.set_row_end(chunk.row_end() + first_row);
  chunk.set_frame(chunk.frame() + first_frame);
  v1::DecodeResponse message;
  *message.mutable_chunk() = std::move(chunk);
  return sink_.Write(message);
}

void LeaderResponse::StreamRows(const at::Tensor& sample, int64_t final_rows) {
  if (caller_gone_ || !stream_status_.ok() || final_rows <= streamed_rows_) return;
  const int64_t first = streamed_rows_;
  const at::Tensor band = sample.narrow(sample.dim() - 2, first, final_rows - first);
  stream_status_ = EmitChunks(band, EncodingOf(request_), max_chunk_bytes_,
                              [&](v1::Chunk&& chunk) { return WriteChunk(std::move(chunk), first, 0); });
  if (!stream_status_.ok()) caller_gone_ = stream_status_.code() == absl::StatusCode::kCancelled;
  streamed_rows_ = final_rows;
}

void LeaderResponse::StreamFrames(const at::Tensor& frames, int64_t first_frame) {
  const int64_t skip = streamed_frames_ - first_frame;
  if (caller_gone_ || !stream_status_.ok() || skip >= frames.size(2)) return;
  const at::Tensor fresh = skip > 0 ? frames.narrow(2, skip, frames.size(2) - skip) : frames;
  const int64_t first = first_frame + (skip > 0 ? skip : 0);
  stream_status_ = EmitChunks(fresh, EncodingOf(request_), max_chunk_bytes_,
                              [&](v1::Chunk&& chunk) { return WriteChunk(std::move(chunk), 0, first); });
  if (!stream_status_.ok()) caller_gone_ = stream_status_.code() == absl::StatusCode::kCancelled;
  streamed_frames_ = first + fresh.size(2);
}

void LeaderResponse::RowsDuringDecode(const DecodePlan& plan, const at::Tensor& sample, int64_t final_rows) {
  if (EnsureHeader(plan)) StreamRows(sample, final_rows);
}

void LeaderResponse::FramesDuringDecode(const DecodePlan& plan, const at::Tensor& frames, int64_t first_frame) {
  if (EnsureHeader(plan)) StreamFrames(frames, first_frame);
}

absl::Status LeaderResponse::Finish(const DecodePlan& plan, const DecodeOutcome& outcome, int world_size) {
  const GroupDecodeResult& result = outcome.result;
  if (!header_sent_) {
    WriteHeader(result.mode, result.reason, result.tile_plan, result.mode == DecodeMode::kDense ? 1 : world_size,
                plan);
  }
  if (!stream_status_.ok() && !caller_gone_) return stream_status_;
  if (caller_gone_) return absl::CancelledError("the caller went away");
  if (streamed_frames_ > 0) {
    StreamFrames(result.sample, 0);
  } else if (StreamsRows(plan)) {
    StreamRows(result.sample, result.sample.size(-2));
  } else {
    stream_status_ = EmitChunks(result.sample, EncodingOf(request_), max_chunk_bytes_,
                                [&](v1::Chunk&& chunk) { return WriteChunk(std::move(chunk), 0, 0); });
  }
  if (!stream_status_.ok()) return stream_status_;

  v1::DecodeResponse trailer_message;
  v1::Trailer* trailer = trailer_message.mutable_trailer();
  trailer->mutable_timings()->set_decode_ms(result.decode_ms);
  trailer->mutable_timings()->set_gather_ms(result.gather_ms);
  trailer->mutable_timings()->set_stream_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
  for (const RankStats& r : outcome.ranks) {
    trailer->add_peak_bytes_per_rank(r.peak_bytes);
    trailer->add_collective_wait_ms_per_rank(r.comm_ms);
  }
  trailer->set_collectives(outcome.comm.collectives());
  trailer->set_tile_retries(result.tile_retries);
  trailer->set_tile_plan(result.tile_plan);
  if (result.tile_retries > 0) {
    spdlog::warn("tiled decode of request {} needed {} out-of-memory retr{}", rpc::LogValue(request_.request_id()),
                 result.tile_retries, result.tile_retries == 1 ? "y" : "ies");
  }
  sink_.Write(trailer_message);
  return absl::OkStatus();
}

}  // namespace vaedecode::worker
