// DecodeSession (proto/vaedecode/v1/vaedecode.proto): one reactor per
// session call. The open is validated and pinned to a group
// (SessionRegistry); each chunk then becomes a Job of its own, queued and
// dispatched like a Decode on that group only, whose stream (ChunkStream)
// drops the per-job header, numbers frames from the clip's first and turns
// the leader's trailer into a ChunkTrailer. Chunks run one at a time, in
// order: the next message is read once the chunk before it has finished.
// The close (or the client's half-close), or the last_chunk once decoded,
// ends the session with a final Trailer (a plain close is refused for a
// model that holds frames for the clip's end: it would lose them); any
// failure ends it with the failure's status. Either way a close job frees
// the session's state on its group.
//
// Threading: gRPC's callback threads (reads, writes, cancel) and the
// thread finishing a chunk's Job meet under the reactor's lock; stream
// operations are started outside it. One write is in flight at a time,
// from one queue shared by the reactor's own messages and the chunk's.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rpc/log_field.h"
#include "rpc/modes.h"
#include "rpc/output_formats.h"
#include "rpc/status.h"
#include "rpc/status_macros.h"
#include "server/decode_service.h"
#include "server/request_validation.h"
#include "server/session_requests.h"

namespace vaedecode::server {
namespace {

std::string NewSessionId() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrFormat("s%016x", gen());
}

class SessionReactor;

// A chunk Job's client stream: forwards into the session's stream.
class ChunkStream final : public JobStream {
 public:
  ChunkStream(SessionReactor& session, Job& job, int64_t chunk, int64_t first_frame)
      : session_(session), job_(job), chunk_(chunk), first_frame_(first_frame) {}
  void StartWrite(const v1::DecodeResponse* message) override;
  void Finish(const absl::Status& status) override;
  void Abort() override;

 private:
  SessionReactor& session_;
  Job& job_;
  const int64_t chunk_;
  const int64_t first_frame_;
  int64_t frames_ = 0;
  // A chunk retried after its group failed streams its frames again; the
  // client has some of them. Tensor outputs come in row bands, the same on
  // every try: a band already forwarded (batch, frame, first row) is
  // skipped. An encoded file (PNG, JPEG) may come in pieces whose bytes
  // differ between tries (an exact decode's rounding), so a file's pieces
  // are held until it is whole (its last piece is followed by another
  // file's or the trailer) and forwarded then; a retry skips the files
  // forwarded and drops the one it held.
  void FlushFile();
  std::set<std::tuple<int64_t, int64_t, int64_t>> bands_;
  std::set<std::pair<int64_t, int64_t>> whole_files_;
  std::optional<std::pair<int64_t, int64_t>> held_file_;
  std::vector<v1::DecodeResponse> held_pieces_;
  bool trailer_sent_ = false;
};

class SessionReactor final : public grpc::ServerBidiReactor<v1::SessionRequest, v1::DecodeResponse> {
 public:
  SessionReactor(grpc::CallbackServerContext* context, DecodeService& service, SessionRegistry& registry,
                 ServerMetrics& metrics, int group_size, std::atomic<int64_t>& active,
                 const std::atomic<bool>& accepting)
      : context_(context),
        service_(service),
        registry_(registry),
        metrics_(metrics),
        group_size_(group_size),
        active_(active),
        accepting_(accepting),
        opened_(absl::Now()),
        idle_timeout_(registry.limits().idle_timeout),
        clock_(service.WatchSession([this] { EndIdle(); }, registry.limits().idle_timeout)) {
    active_.fetch_add(1);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&clock_->mu);
      clock_->waiting_since = absl::InfiniteFuture();
    }
    // The session may have ended meanwhile (a cancel, the idle watch): then
    // the message is not acted on.
    if (!Enter()) return Pump();
    HandleRead(ok);
    Leave();
  }

  // A message read (ok) or the end of the client's stream; between Enter
  // and Leave, so the session cannot conclude under it.
  void HandleRead(bool ok) {
    if (!ok) {
      // The client half-closed (a close without its message) or the call ended.
      if (record_ == nullptr) return End(ReadFailure("before opening the session"));
      return context_->IsCancelled() ? End(ReadFailure("between chunks")) : End(CloseWithoutLastChunk());
    }
    switch (in_.kind_case()) {
      case v1::SessionRequest::kOpen:
        if (record_ != nullptr) return End(absl::InvalidArgumentError("the session is already open"));
        return Open(in_.open());
      case v1::SessionRequest::kChunk:
        if (record_ == nullptr) return End(absl::InvalidArgumentError("the first message must open the session"));
        return RunChunk(in_.chunk(), /*last=*/false);
      case v1::SessionRequest::kLastChunk:
        if (record_ == nullptr) return End(absl::InvalidArgumentError("the first message must open the session"));
        return RunChunk(in_.last_chunk(), /*last=*/true);
      case v1::SessionRequest::kClose:
        if (record_ == nullptr) return End(absl::InvalidArgumentError("the first message must open the session"));
        return End(CloseWithoutLastChunk());
      default:
        return End(absl::InvalidArgumentError("a SessionRequest must be open, chunk, last_chunk or close"));
    }
  }

  void OnWriteDone(bool ok) override {
    std::function<void(bool)> done;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      done = std::move(current_done_);
    }
    if (done) done(ok);
    Pump();
  }

  void OnCancel() override {
    absl::Status reason;
    if (absl::Now() >= rpc::CallDeadline(*context_)) {
      reason = absl::DeadlineExceededError("the session's deadline passed");
    } else if (!accepting_.load()) {
      reason = absl::UnavailableError("the server is draining and its drain timeout cut the session");
    } else {
      reason = absl::CancelledError("cancelled by the client");
    }
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      job = chunk_job_;
    }
    if (job) job->Cancel(reason);
    End(reason);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&clock_->mu);  // the watch may be in EndIdle: it returns first
      clock_->end_idle = nullptr;
    }
    active_.fetch_sub(1);
    delete this;
  }

  // ---- for ChunkStream ---------------------------------------------------
  // Queues `message` (none: nothing to write) for the client; `done` runs
  // once it is written (or failed), outside the lock.
  void Send(std::optional<v1::DecodeResponse> message, std::function<void(bool)> done) {
    {
      absl::MutexLock lock(&mu_);
      out_.push_back({std::move(message), std::move(done)});
    }
    Pump();
  }
  void FirstFrame() {
    absl::MutexLock lock(&mu_);
    if (first_frame_at_ == absl::InfiniteFuture()) {
      first_frame_at_ = absl::Now();
      metrics_.RecordSessionFirstFrame(absl::ToDoubleSeconds(first_frame_at_ - opened_));
    }
  }
  void ChunkTrailer(const v1::ChunkTrailer& trailer) {
    int64_t most = 0;
    for (int64_t b : trailer.state_bytes_per_rank()) most = std::max(most, b);
    absl::Status grown = registry_.Grow(*record_, most);
    absl::MutexLock lock(&mu_);
    if (!grown.ok() && outgrown_.ok()) outgrown_ = grown;
    frames_ += trailer.frames();
    decode_ms_ += trailer.timings().decode_ms();
    collectives_ += trailer.collectives();
    replayed_ += trailer.replayed_latent_frames();
    int64_t state = 0;
    for (int64_t b : trailer.state_bytes_per_rank()) state += b;
    metrics_.AddSessionStateBytes(state - state_bytes_);
    state_bytes_ = state;
  }
  void ChunkFinished(const absl::Status& status) {
    bool read_next = false;
    bool end = true;
    absl::Status end_status;
    {
      absl::MutexLock lock(&mu_);
      chunk_job_ = nullptr;
      if (status.ok()) {
        ++chunks_;
        metrics_.RecordSessionChunk(absl::ToDoubleSeconds(absl::Now() - chunk_arrived_));
      }
      // Busy until this call is done, so that nothing concludes (and frees)
      // the session under this thread: a cancel meanwhile, or a write's
      // Pump between End marking the session ending and queueing its trailer.
      ++busy_;
      if (!status.ok()) {
        end_status = status;
      } else if (ending_) {
        end = false;  // ended meanwhile: it concludes at Leave
      } else if (clip_ended_) {
        // The last chunk: the clip is whole (a group outgrown meanwhile no longer matters).
      } else if (!outgrown_.ok()) {
        end_status = outgrown_;
      } else {
        end = false;
        read_next = true;
      }
    }
    if (end) End(end_status);
    if (read_next) ReadNext();
    Leave();
  }
  void CancelCall() { context_->TryCancel(); }

  // The stall watch (under the clock's lock): no message for the idle timeout.
  void EndIdle() {
    End(absl::DeadlineExceededError(absl::StrCat("the session waited ", absl::FormatDuration(idle_timeout_),
                                                 " for its client's next message and was ended (idle timeout; "
                                                 "SessionOpen.idle_timeout_ms, --session_idle_timeout_s)")));
  }

 private:
  struct Outgoing {
    std::optional<v1::DecodeResponse> message;
    std::function<void(bool)> done;
  };

  // Enter: false once the session is ending (the caller drops what it was
  // about to do); else the session cannot conclude until Leave.
  bool Enter() {
    absl::MutexLock lock(&mu_);
    if (ending_) return false;
    ++busy_;
    return true;
  }
  void Leave() {
    {
      absl::MutexLock lock(&mu_);
      --busy_;
    }
    Pump();  // last: the session may conclude (and be freed) here
  }

  // A close (or half-close) with no last_chunk: fine, unless the model held
  // frames for the clip's end, which the close would lose.
  absl::Status CloseWithoutLastChunk() {
    absl::MutexLock lock(&mu_);
    if (!model_.session_holds_clip_end() || chunks_ == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "model \"", model_.name(), "\" (", model_.diffusers_class(),
        ") holds a session's last frames until its clip ends: send the last chunk as SessionRequest.last_chunk, "
        "not a chunk and a close (the held frames are lost)"));
  }

  absl::Status ReadFailure(const std::string& when) {
    return absl::CancelledError(absl::StrCat("the client's stream ended ", when));
  }

  void ReadNext() {
    {
      absl::MutexLock lock(&clock_->mu);
      clock_->waiting_since = absl::Now();
      clock_->timeout = idle_timeout_;
    }
    StartRead(&in_);
  }

  void Open(const v1::SessionOpen& open) {
    open_ = open;
    if (open_.session_id().empty()) open_.set_session_id(NewSessionId());
    absl::Status status = Validate();
    if (status.ok()) {
      idle_timeout_ = registry_.limits().idle_timeout;
      if (open_.idle_timeout_ms() > 0) {
        idle_timeout_ = std::min(idle_timeout_, absl::Milliseconds(open_.idle_timeout_ms()));
      }
      absl::StatusOr<std::shared_ptr<SessionRecord>> record =
          registry_.Open(open_.session_id(), open_.model(), mode_, state_bytes_per_rank_, chunk_peak_bytes_);
      if (record.ok()) {
        record_ = *std::move(record);
        metrics_.AddSessionsOpen(1);
      } else {
        status = record.status();
      }
    }
    if (!status.ok()) return End(status);
    v1::DecodeResponse message;
    v1::SessionHeader* header = message.mutable_session_header();
    header->set_session_id(open_.session_id());
    const int64_t b = open_.shape(0);
    const int64_t c = model_.out_channels();
    const int64_t h = open_.shape(2) * model_.spatial_factor();
    const int64_t w = open_.shape(3) * model_.spatial_factor();
    const rpc::OutputFormatInfo& format = *rpc::FindOutputFormat(open_.output_format());  // validated
    for (int64_t d : format.channels_last ? std::vector<int64_t>{b, 0, h, w, c} : std::vector<int64_t>{b, c, 0, h, w}) {
      header->add_shape(d);
    }
    header->set_dtype(format.dtype);
    header->set_output_format(open_.output_format());
    header->set_mode(mode_);
    header->set_degree(mode_ == v1::MODE_EXACT ? group_size_ : 1);
    header->set_mode_reason(mode_reason_);
    header->set_height(h);
    header->set_width(w);
    header->set_state_bytes(state_bytes_per_rank_);
    Send(std::move(message), nullptr);
    ReadNext();
  }

  // The open against its model; sets model_, mode_, mode_reason_ and
  // state_bytes_per_rank_.
  absl::Status Validate() {
    if (!accepting_.load()) return absl::UnavailableError("the server is draining; retry on another replica");
    absl::StatusOr<v1::ModelInfo> model = service_.LookupModel(open_.model());
    if (!model.ok()) return model.status();
    model_ = *std::move(model);
    ASSIGN_OR_RETURN(
        const SessionPlan plan,
        ValidateSessionOpen(open_, model_, group_size_, service_.admission_limits(), service_.max_request_bytes()));
    mode_ = plan.mode;
    mode_reason_ = plan.mode_reason;
    state_bytes_per_rank_ = plan.state_bytes_per_rank;
    chunk_peak_bytes_ = plan.chunk_peak_bytes;
    return absl::OkStatus();
  }

  // A chunk, or the clip's last (`last`: the session ends after it).
  void RunChunk(const v1::Tensor& chunk, bool last) {
    if (absl::Status fits = ValidateSessionChunk(open_, chunk); !fits.ok()) return End(fits);
    int64_t index;
    {
      absl::MutexLock lock(&mu_);
      index = chunks_;
      chunk_arrived_ = absl::Now();
      clip_ended_ = last;
    }
    v1::DecodeRequest request = SessionChunkRequest(open_, mode_, index);
    *request.mutable_latent() = chunk;
    DecodeService::Admission admission =
        service_.Admit(std::move(request), absl::Now(), rpc::CallDeadline(*context_), "grpc");
    if (!admission.status.ok()) return End(admission.status);
    admission.job->SetSession(record_, last ? Job::SessionPart::kLastChunk : Job::SessionPart::kChunk);
    int64_t first_frame;
    {
      absl::MutexLock lock(&mu_);
      if (ending_) return;  // cancelled meanwhile: the chunk is not started
      first_frame = frames_;
      chunk_job_ = admission.job;
    }
    auto stream = std::make_shared<ChunkStream>(*this, *admission.job, index, first_frame);
    service_.StartSessionJob(admission, stream.get(), stream);
  }

  // Ends the session with `status` (the first call decides): a final
  // trailer when OK, then Finish once the chunk in flight and the queued
  // writes are done.
  void End(absl::Status status) {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !ending_;
      ending_ = true;
      if (first) end_status_ = status;
    }
    if (first && status.ok()) {
      v1::DecodeResponse message;
      v1::Trailer* trailer = message.mutable_trailer();
      absl::MutexLock lock(&mu_);
      trailer->mutable_timings()->set_decode_ms(decode_ms_);
      trailer->mutable_timings()->set_total_ms(absl::ToDoubleMilliseconds(absl::Now() - opened_));
      trailer->set_collectives(collectives_);
      trailer->set_session_chunks(chunks_);
      trailer->set_session_frames(frames_);
      out_.push_back({std::move(message), nullptr});
    }
    Pump();
  }

  // Starts the next write, or, once ending and nothing is left, finishes.
  void Pump() {
    while (true) {
      std::function<void(bool)> done;
      bool finish = false;
      bool write = false;
      {
        absl::MutexLock lock(&mu_);
        if (writing_ || finished_) return;
        if (out_.empty()) {
          if (!ending_ || chunk_job_ != nullptr || busy_ > 0) return;
          finished_ = true;
          finish = true;
        } else {
          Outgoing next = std::move(out_.front());
          out_.pop_front();
          if (next.message) {
            write = true;
            writing_ = true;
            current_ = *std::move(next.message);
            current_done_ = std::move(next.done);
          } else {
            done = std::move(next.done);
          }
        }
      }
      if (finish) return Conclude();
      if (write) {
        StartWrite(&current_);  // writing_ is set: nothing else touches current_
        return;
      }
      if (done) done(true);
    }
  }

  // The session is over: its state is freed (and then its room), it is
  // logged, and the call finishes.
  void Conclude() {
    absl::Status status;
    int64_t chunks, frames, collectives, replayed, state_bytes;
    double decode_ms;
    absl::Time first_frame_at;
    {
      absl::MutexLock lock(&mu_);
      status = end_status_;
      chunks = chunks_;
      frames = frames_;
      collectives = collectives_;
      replayed = replayed_;
      state_bytes = state_bytes_;
      decode_ms = decode_ms_;
      first_frame_at = first_frame_at_;
    }
    if (record_ != nullptr) {
      // Its room in the registry is given back once the close job has freed the state.
      service_.CloseSessionState(record_, model_);
      metrics_.AddSessionsOpen(-1);
      metrics_.AddSessionStateBytes(-state_bytes);
    }
    metrics_.RecordSessionEnd(status.code());
    const double first_frame_ms =
        first_frame_at == absl::InfiniteFuture() ? -1 : absl::ToDoubleMilliseconds(first_frame_at - opened_);
    spdlog::info(
        "session id={} protocol=grpc model={} latent=[{}] format={} mode={} group={} chunks={} frames={} "
        "first_frame_ms={:.1f} decode_ms={:.1f} collectives={} replayed_latent_frames={} total_ms={:.1f} status={} "
        "message={}",
        rpc::LogValue(open_.session_id()), open_.model().empty() ? "-" : rpc::LogValue(open_.model()),
        absl::StrJoin(open_.shape(), ","),
        v1::OutputFormat_IsValid(open_.output_format()) ? v1::OutputFormat_Name(open_.output_format()) : "?",
        rpc::ModeLabel(mode_), record_ != nullptr ? record_->group() : "-", chunks, frames, first_frame_ms, decode_ms,
        collectives, replayed, absl::ToDoubleMilliseconds(absl::Now() - opened_), rpc::StatusCodeName(status.code()),
        rpc::LogValue(status.message()));
    Finish(rpc::ToGrpcStatus(status));
  }

  grpc::CallbackServerContext* const context_;
  DecodeService& service_;
  SessionRegistry& registry_;
  ServerMetrics& metrics_;
  const int group_size_;
  std::atomic<int64_t>& active_;
  const std::atomic<bool>& accepting_;
  const absl::Time opened_;
  absl::Duration idle_timeout_;  // set again by Open, before the clock reads it
  const std::shared_ptr<SessionClock> clock_;
  v1::SessionRequest in_;  // the read in flight

  // Set by Open, on the read thread, before any chunk.
  v1::SessionOpen open_;
  v1::ModelInfo model_;
  v1::Mode mode_ = v1::MODE_DENSE;
  std::string mode_reason_;
  int64_t state_bytes_per_rank_ = 0;
  int64_t chunk_peak_bytes_ = 0;
  std::shared_ptr<SessionRecord> record_;

  absl::Mutex mu_;
  std::deque<Outgoing> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::DecodeResponse current_;  // the write in flight
  std::function<void(bool)> current_done_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Job> chunk_job_ ABSL_GUARDED_BY(mu_);
  absl::Time chunk_arrived_ ABSL_GUARDED_BY(mu_);
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool clip_ended_ ABSL_GUARDED_BY(mu_) = false;  // the last chunk came
  int busy_ ABSL_GUARDED_BY(mu_) = 0;             // callbacks between Enter and Leave
  absl::Status outgrown_ ABSL_GUARDED_BY(mu_);    // the states outgrew the group (Grow)
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  // The session's figures, for the final trailer and the log line.
  int64_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frames_ ABSL_GUARDED_BY(mu_) = 0;
  double decode_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t collectives_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t replayed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t state_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_frame_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

void ChunkStream::FlushFile() {
  if (!held_file_) return;
  whole_files_.insert(*held_file_);
  held_file_.reset();
  if (!held_pieces_.empty()) session_.FirstFrame();
  for (v1::DecodeResponse& piece : held_pieces_) session_.Send(std::move(piece), nullptr);
  held_pieces_.clear();
}

void ChunkStream::StartWrite(const v1::DecodeResponse* message) {
  const auto written = [this](bool ok) { job_.OnWriteDone(ok); };
  if (message->has_header()) {
    // The session's header said it all; a later header starts a retry,
    // whose file in hand was not forwarded.
    frames_ = message->header().frames();
    held_file_.reset();
    held_pieces_.clear();
    return session_.Send(std::nullopt, written);
  }
  if (message->has_chunk()) {
    const v1::Chunk& c = message->chunk();
    v1::DecodeResponse renumbered = *message;
    renumbered.mutable_chunk()->set_frame(first_frame_ + c.frame());
    if (rpc::FindOutputFormat(job_.request().output_format())->encoded) {
      const std::pair<int64_t, int64_t> file{c.batch_index(), c.frame()};
      if (whole_files_.count(file) == 0) {
        if (held_file_ != file) FlushFile();  // the file before is whole
        held_file_ = file;
        held_pieces_.push_back(std::move(renumbered));
      }
      return session_.Send(std::nullopt, written);
    }
    if (!bands_.insert({c.batch_index(), c.frame(), c.row_begin()}).second) {
      return session_.Send(std::nullopt, written);  // forwarded before the retry
    }
    session_.FirstFrame();
    return session_.Send(std::move(renumbered), written);
  }
  if (message->has_trailer() && !trailer_sent_) {
    FlushFile();
    trailer_sent_ = true;
    const v1::Trailer& t = message->trailer();
    v1::DecodeResponse answer;
    v1::ChunkTrailer* trailer = answer.mutable_chunk_trailer();
    trailer->set_chunk(chunk_);
    trailer->set_first_frame(first_frame_);
    trailer->set_frames(frames_);
    *trailer->mutable_timings() = t.timings();
    trailer->set_collectives(t.collectives());
    *trailer->mutable_state_bytes_per_rank() = t.session_state_bytes_per_rank();
    if (job_.session() != nullptr) trailer->set_replayed_latent_frames(job_.session()->last_replayed());
    session_.ChunkTrailer(*trailer);
    return session_.Send(std::move(answer), written);
  }
  session_.Send(std::nullopt, written);  // a second trailer (a retried chunk's): the client has one
}

void ChunkStream::Finish(const absl::Status& status) { session_.ChunkFinished(status); }

void ChunkStream::Abort() { session_.CancelCall(); }

}  // namespace

grpc::ServerBidiReactor<v1::SessionRequest, v1::DecodeResponse>* DecodeService::DecodeSession(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(context, *this, *sessions_, metrics_, options_.group_size, active_, accepting_);
}

}  // namespace vaedecode::server
