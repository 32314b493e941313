#include "worker/leader_response.h"

#include <chrono>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "device/host_copy.h"
#include "rpc/log_field.h"
#include "rpc/output_formats.h"
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

// One thread that runs the response's tasks in order (encoding and writing),
// with at most kMaxQueuedBytes of host tensors waiting for it.
class LeaderResponse::Writer {
 public:
  Writer() : thread_([this] { Loop(); }) {}
  ~Writer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Queues `task`, which holds `bytes` of output until it has run; waits
  // while the queue already holds more than kMaxQueuedBytes.
  void Run(std::function<void()> task, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    const auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queued_bytes_ <= kMaxQueuedBytes || tasks_.empty();
    };
    mu_.Await(absl::Condition(&room));
    queued_bytes_ += bytes;
    tasks_.push_back({std::move(task), bytes});
  }

  // Waits until every queued task has run.
  void Drain() {
    absl::MutexLock lock(&mu_);
    const auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return tasks_.empty() && !running_; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  struct Task {
    std::function<void()> run;
    int64_t bytes;
  };

  void Loop() {
    while (true) {
      Task task;
      {
        absl::MutexLock lock(&mu_);
        const auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;  // stopping, and nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
        running_ = true;
      }
      task.run();
      task.run = nullptr;  // the tensors it held go before the queue counts them gone
      absl::MutexLock lock(&mu_);
      queued_bytes_ -= task.bytes;
      running_ = false;
    }
  }

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses
};

LeaderResponse::LeaderResponse(ResponseSink& sink, const v1::DecodeRequest& request, int64_t max_chunk_bytes,
                               std::vector<int64_t> out_shape, std::string dtype_note,
                               const families::PixelConvention& pixels, int64_t sample_rate)
    : sink_(sink),
      request_(request),
      encoding_(EncodingOf(request, pixels, sample_rate)),
      max_chunk_bytes_(max_chunk_bytes),
      out_shape_(std::move(out_shape)),
      dtype_note_(std::move(dtype_note)),
      writer_(std::make_unique<Writer>()) {}

LeaderResponse::~LeaderResponse() { writer_->Drain(); }

void LeaderResponse::MuxAudio(at::Tensor waveform, int64_t sample_rate) {
  encoding_.audio = std::move(waveform);
  encoding_.audio_sample_rate = sample_rate;
}

bool LeaderResponse::over() const {
  absl::MutexLock lock(&mu_);
  return caller_gone_ || !stream_status_.ok();
}

bool LeaderResponse::StreamsRows(const DecodePlan& plan) const {
  const rpc::OutputFormatInfo* f = rpc::FindOutputFormat(request_.output_format());
  return (plan.mode == DecodeMode::kTiled || plan.mode == DecodeMode::kExact) && f != nullptr &&
         f->chunking == rpc::Chunking::kRowBands && out_shape_[0] == 1 &&
         (out_shape_.size() == 4 || out_shape_[2] == 1);
}

bool LeaderResponse::StreamsFrames(const DecodePlan& plan) const {
  // Chunks go batch entry by batch entry: a second entry's frames would wait
  // for the first's, so only one entry streams early. An MP4 needs every frame.
  const rpc::OutputFormatInfo* f = rpc::FindOutputFormat(request_.output_format());
  return plan.mode != DecodeMode::kTiled && f != nullptr && f->chunking != rpc::Chunking::kFilePerEntry &&
         out_shape_.size() == 5 && out_shape_[0] == 1 && out_shape_[2] > 1;
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

bool LeaderResponse::QueueHeader(DecodeMode mode, const std::string& reason, const std::string& tile_plan, int degree,
                                 const DecodePlan& plan) {
  v1::DecodeResponse message;
  v1::Header* header = message.mutable_header();
  header->set_request_id(request_.request_id());
  header->set_mode(ProtoMode(mode));
  header->set_degree(degree);
  // A force_upcast model says it decodes in float32, not the float16 asked for.
  header->set_mode_reason(dtype_note_.empty() ? reason : absl::StrCat(reason, "; ", dtype_note_));
  header->set_tile_plan(tile_plan);
  if (plan.noise_seed) header->set_noise_seed(*plan.noise_seed);
  if (out_shape_.size() == 3) header->set_sample_rate(encoding_.sample_rate);  // a waveform
  header_queued_ = true;
  if (absl::Status s = DescribeOutput(out_shape_, request_.output_format(), header); !s.ok()) {
    absl::MutexLock lock(&mu_);
    stream_status_ = s;
    return false;
  }
  writer_->Run(
      [this, message = std::move(message)] {
        if (over()) return;
        if (!sink_.Write(message)) {
          absl::MutexLock lock(&mu_);
          caller_gone_ = true;
        }
      },
      0);
  return !over();
}

bool LeaderResponse::EnsureHeader(const DecodePlan& plan) {
  if (header_queued_) return !over();
  const std::string tile_plan = plan.mode == DecodeMode::kTiled ? DescribePlan(plan.tiles, plan.world_size) : "";
  return QueueHeader(plan.mode, plan.reason, tile_plan, plan.mode == DecodeMode::kDense ? 1 : plan.world_size, plan);
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

void LeaderResponse::QueueChunks(const at::Tensor& part, int64_t first_row, int64_t first_frame) {
  // Started here, behind the decode's queued work; the writer waits for it.
  auto copy = std::make_shared<device::HostCopy>(device::HostCopy::Start(part));
  writer_->Run(
      [this, copy, first_row, first_frame] {
        if (over()) return;
        const absl::Status status = EmitChunks(copy->Wait(), encoding_, max_chunk_bytes_, [&](v1::Chunk&& chunk) {
          return WriteChunk(std::move(chunk), first_row, first_frame);
        });
        if (!status.ok()) {
          absl::MutexLock lock(&mu_);
          if (status.code() == absl::StatusCode::kCancelled) {
            caller_gone_ = true;
          } else if (stream_status_.ok()) {
            stream_status_ = status;
          }
        }
      },
      static_cast<int64_t>(part.numel()) * part.element_size());
}

void LeaderResponse::StreamRows(const at::Tensor& sample, int64_t final_rows) {
  if (over() || final_rows <= streamed_rows_) return;
  const int64_t first = streamed_rows_;
  QueueChunks(sample.narrow(sample.dim() - 2, first, final_rows - first), first, 0);
  streamed_rows_ = final_rows;
}

void LeaderResponse::StreamFrames(const at::Tensor& frames, int64_t first_frame) {
  const int64_t skip = streamed_frames_ - first_frame;
  if (over() || skip >= frames.size(2)) return;
  const at::Tensor fresh = skip > 0 ? frames.narrow(2, skip, frames.size(2) - skip) : frames;
  const int64_t first = first_frame + (skip > 0 ? skip : 0);
  QueueChunks(fresh, 0, first);
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
  if (!header_queued_) {
    QueueHeader(result.mode, result.reason, result.tile_plan, result.mode == DecodeMode::kDense ? 1 : world_size, plan);
  }
  if (streamed_frames_ > 0) {
    StreamFrames(result.sample, 0);
  } else if (StreamsRows(plan)) {
    StreamRows(result.sample, result.sample.size(-2));
  } else if (!over()) {
    QueueChunks(result.sample, 0, 0);
  }
  writer_->Drain();
  {
    absl::MutexLock lock(&mu_);
    if (caller_gone_) return absl::CancelledError("the caller went away");
    if (!stream_status_.ok()) return stream_status_;
  }

  v1::DecodeResponse trailer_message;
  v1::Trailer* trailer = trailer_message.mutable_trailer();
  trailer->mutable_timings()->set_decode_ms(result.decode_ms);
  trailer->mutable_timings()->set_gather_ms(result.gather_ms);
  trailer->mutable_timings()->set_stream_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
  for (const RankStats& r : outcome.ranks) {
    trailer->add_peak_bytes_per_rank(r.peak_bytes);
    trailer->add_collective_wait_ms_per_rank(r.comm_ms);
    if (plan.session.id != 0) trailer->add_session_state_bytes_per_rank(r.session_state_bytes);
  }
  trailer->set_collectives(outcome.comm.collectives());
  trailer->set_tile_retries(result.tile_retries);
  trailer->set_tile_plan(result.tile_plan);
  if (result.tile_retries > 0) {
    spdlog::warn("tiled decode of request {} needed {} out-of-memory retr{}", rpc::LogValue(request_.request_id()),
                 result.tile_retries, result.tile_retries == 1 ? "y" : "ies");
  }
  // The writer is idle: the trailer goes from here, last.
  sink_.Write(trailer_message);
  return absl::OkStatus();
}

}  // namespace vaedecode::worker
