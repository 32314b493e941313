#include "worker/group_runtime.h"

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/compute_device.h"
#include "device/device_memory.h"
#include "rpc/status_macros.h"
#include "worker/decode_job.h"

namespace vaedecode::worker {
namespace {

// Errors after which the group is still in step, so it keeps serving: bad
// input is caught before any collective; a cancellation is learnt by all
// ranks in the same collective; a tiled decode's exhausted ladder is agreed
// by all ranks (IsInStep); and a group of one has no peer to be out of step
// with (an out-of-memory freed the job's tensors while unwinding).
bool IsGroupSafe(const absl::Status& s, int world_size) {
  if (IsInStep(s)) return true;  // every rank returned it at the same step
  if (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kCancelled) return true;
  return s.code() == absl::StatusCode::kResourceExhausted && (world_size == 1 || IsInStep(s));
}

// A failure that is the request's (a cancel, a lack of memory, a refusal),
// not its device's: a rank that saw it alone can go on.
bool IsRequestFailure(const absl::Status& s) {
  return s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kResourceExhausted ||
         s.code() == absl::StatusCode::kInvalidArgument;
}

// A failure the leader alone saw (marked LeaderOnly by the dense path: the
// peers wait in the statistics gather meanwhile) and can recover from.
bool IsLeaderOnlyRecoverable(const absl::Status& s) { return IsLeaderOnly(s) && IsRequestFailure(s); }

// The ranks of `comm` that could not load their encoder (`loaded`: this
// rank's own outcome), the same list on every rank.
absl::StatusOr<std::vector<int>> RanksWithoutTheirEncoder(parallel::Communicator& comm, bool loaded) {
  const at::Tensor mine = at::tensor({loaded ? 0 : 1}, at::kInt).to(comm.device());
  const std::vector<int64_t> ones(comm.world_size(), 1);
  ASSIGN_OR_RETURN(at::Tensor all, comm.AllGather(mine, ones, parallel::CallKind::kOther));
  all = all.cpu();
  RETURN_IF_ERROR(comm.Synchronize());  // what was read came from a gather that finished
  std::vector<int> failed;
  for (int r = 0; r < comm.world_size(); ++r) {
    if (all[r].item<int>() != 0) failed.push_back(r);
  }
  return failed;
}

}  // namespace

int64_t ReplayedOutputFrames(const families::Decoder& decoder, const DecodePlan& plan) {
  const int64_t replayed = plan.session.replayed_latent_frames;
  if (replayed <= 0 || !plan.latent.defined()) return 0;
  return decoder.StreamedFrames(replayed, /*clip_ended=*/false);
}

GroupRuntime::GroupRuntime(std::unique_ptr<parallel::Communicator> comm, std::vector<NamedModel> models,
                           absl::Duration heartbeat, std::unique_ptr<GroupRecovery> recovery)
    : comm_(std::move(comm)),
      rank_(comm_->rank()),
      world_size_(comm_->world_size()),
      device_(comm_->device()),
      recovery_(std::move(recovery)),
      models_(std::move(models)),
      heartbeat_(heartbeat) {
  last_step_ = absl::Now();
  // Start-up memory report: the leader learns every rank's free bytes.
  absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, GroupDecodeResult{});
  if (ranks.ok()) {
    RecordStats(*ranks);
  } else {
    MarkBroken(ranks.status());
  }
  if (rank_ == kLeader && world_size_ > 1) {
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  }
}

GroupRuntime::~GroupRuntime() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

int GroupRuntime::FindModel(const std::string& name) const {
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

void GroupRuntime::MarkBroken(const absl::Status& why) {
  if (!broken_.exchange(true)) spdlog::error("worker group broken (rank {}): {}", rank_, why.ToString());
}

absl::Status GroupRuntime::RecoverOrBreak(const absl::Status& failure) {
  if (recovery_ != nullptr && world_size_ > 1) {
    absl::StatusOr<Recovered> recovered = recovery_->Recover(failure, &comm_);
    if (recovered.ok()) return InStep(recovered->answer);
    MarkBroken(absl::Status(failure.code(), absl::StrCat(failure.message(), " (not recoverable in place: ",
                                                         recovered.status().message(), ")")));
    return failure;
  }
  MarkBroken(failure);
  return failure;
}

void GroupRuntime::HeartbeatLoop() {
  device::UseComputeDevice(device_);
  while (true) {
    absl::MutexLock lock(&mu_);
    const absl::Time due = last_step_ + heartbeat_;
    auto ready = [this, due]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || absl::Now() >= due; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), due);
    if (stopping_ || broken_) return;
    if (absl::Now() < last_step_ + heartbeat_) continue;  // a job ran meanwhile
    GroupJob beat;
    beat.kind = JobKind::kHeartbeat;
    absl::StatusOr<GroupJob> sent = BroadcastJob(*comm_, &beat);
    last_step_ = absl::Now();
    if (!sent.ok()) {
      MarkBroken(sent.status());
      return;
    }
  }
}

void GroupRuntime::RecordStats(const std::vector<RankStats>& ranks) {
  if (ranks.empty()) return;  // peers receive nothing
  absl::MutexLock lock(&stats_mu_);
  rank_stats_ = ranks;
}

std::vector<int64_t> GroupRuntime::free_bytes_per_rank() const {
  absl::MutexLock lock(&stats_mu_);
  std::vector<int64_t> out;
  for (const RankStats& r : rank_stats_) out.push_back(r.free_bytes);
  return out;
}

std::vector<int64_t> GroupRuntime::capacity_bytes_per_rank() const {
  absl::MutexLock lock(&stats_mu_);
  std::vector<int64_t> out;
  for (const RankStats& r : rank_stats_) out.push_back(r.capacity_bytes);
  return out;
}

absl::StatusOr<DecodeOutcome> GroupRuntime::Run(const GroupJob& job, const std::atomic<bool>* cancelled,
                                                const OutputProgress& progress) {
  absl::MutexLock job_lock(&job_mu_);
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::UnavailableError("the worker group has failed and is being rebuilt");
  if (cancelled != nullptr && cancelled->load()) return absl::CancelledError("the request was cancelled");
  absl::StatusOr<DecodeOutcome> outcome = Execute(job, cancelled, progress);
  last_step_ = absl::Now();
  if (outcome.ok()) return outcome;
  return AnswerFailure(outcome.status());
}

absl::Status GroupRuntime::AnswerFailure(const absl::Status& failure) {
  if (IsGroupSafe(failure, world_size_)) return failure;
  const absl::Status answer = RecoverOrBreak(failure);
  if (!broken_) return answer;
  // A collective that timed out is the group's failure, not the caller's
  // deadline (the server rebuilds the group; the client may retry).
  if (absl::IsDeadlineExceeded(failure)) {
    return absl::UnavailableError(absl::StrCat("the worker group failed: ", failure.message()));
  }
  return failure;
}

absl::StatusOr<families::Encoder*> GroupRuntime::Encoder(int64_t model_index) {
  if (model_index < 0 || model_index >= static_cast<int64_t>(models_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no model with index ", model_index));
  }
  absl::MutexLock lock(&encoders_mu_);
  if (encoders_.empty()) encoders_.resize(models_.size());
  std::unique_ptr<families::Encoder>& encoder = encoders_[model_index];
  if (encoder == nullptr) {
    ASSIGN_OR_RETURN(encoder, LoadEncoderFor(models_[model_index]));
    spdlog::info("event=encoder_loaded model={} rank={} parameters={}", models_[model_index].name, rank_,
                 encoder->info().parameter_count);
  }
  return encoder.get();
}

absl::StatusOr<GroupRuntime::EncodeRoom> GroupRuntime::EncodeRoomFor(int64_t model_index) {
  ASSIGN_OR_RETURN(families::Encoder * encoder, Encoder(model_index));
  absl::MutexLock job_lock(&job_mu_);
  EncodeRoom room;
  room.free_bytes_per_rank = free_bytes_per_rank();
  device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (memory == nullptr) return room;
  if (!room.free_bytes_per_rank.empty() && room.free_bytes_per_rank[0] >= 0) {
    room.free_bytes_per_rank[0] = memory->free_bytes();
  }
  if (!EncoderAgreed(model_index)) {
    const int64_t weights = encoder->info().parameter_count * static_cast<int64_t>(c10::elementSize(encoder->dtype()));
    for (size_t r = 1; r < room.free_bytes_per_rank.size(); ++r) {
      int64_t& free = room.free_bytes_per_rank[r];
      if (free >= 0) free = std::max<int64_t>(0, free - weights);
    }
  }
  if (encode_peaks_.empty()) encode_peaks_.resize(models_.size());
  std::optional<EncodePeakModel>& peak = encode_peaks_[model_index];
  if (!peak) {
    const auto start = absl::Now();
    ASSIGN_OR_RETURN(peak, CalibrateEncodePeak(*encoder, tiling::ProbeOf(*memory)));
    spdlog::info(
        "event=encode_calibrated model={} fixed_mib={:.1f} bytes_per_pixel={:.1f} bytes_per_pixel_pair={:.3g} "
        "frame_growth={:.2f} ms={:.0f}",
        models_[model_index].name, peak->fixed_bytes / 1048576.0, peak->bytes_per_pixel, peak->bytes_per_pixel_pair,
        peak->frame_growth, absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  room.peak = *peak;
  return room;
}

absl::StatusOr<at::Tensor> GroupRuntime::DecodeOnLeader(int64_t model_index, const DecodeJob& job,
                                                        const std::atomic<bool>* cancelled) {
  // Between the group's jobs, but not under mu_: the heartbeats go on while
  // the leader decodes (the peers wait for the next job meanwhile).
  absl::MutexLock job_lock(&job_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (broken_) return absl::UnavailableError("the worker group has failed and is being rebuilt");
  }
  if (model_index < 0 || model_index >= static_cast<int64_t>(models_.size())) {
    return absl::InternalError("DecodeOnLeader: no such model");
  }
  families::CancellableDenseOps ops(cancelled);
  absl::StatusOr<at::Tensor> sample = RunDecode(*models_[model_index].decoder, job, ops);
  // Anything but the request's own failure is the leader's device's (a
  // sticky CUDA error): the group is broken, as after a failed job, and the
  // server rebuilds it. The peers took no part, so there is nothing to
  // recover in place.
  if (!sample.ok() && !IsRequestFailure(sample.status())) MarkBroken(sample.status());
  return sample;
}

absl::StatusOr<EncodeOutcome> GroupRuntime::RunEncode(const GroupJob& job, const std::atomic<bool>* cancelled) {
  // Loaded before the job starts: a model that cannot encode leaves the group untouched.
  ASSIGN_OR_RETURN(families::Encoder * encoder, Encoder(job.model_index));
  absl::MutexLock job_lock(&job_mu_);
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::UnavailableError("the worker group has failed and is being rebuilt");
  if (cancelled != nullptr && cancelled->load()) return absl::CancelledError("the request was cancelled");
  absl::StatusOr<EncodeOutcome> outcome = ExecuteEncode(*encoder, job, cancelled);
  last_step_ = absl::Now();
  if (outcome.ok()) return outcome;
  return AnswerFailure(outcome.status());
}

absl::StatusOr<std::pair<at::Tensor, GroupDecodeResult>> GroupRuntime::EncodeStep(
    families::Encoder& encoder, parallel::CountingCommunicator& counting, const EncodePlan& plan,
    const std::atomic<bool>* cancelled) {
  device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (memory != nullptr) memory->ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  (void)counting.TakeDeviceCallMs();  // the encode's calls only, not the job's broadcast
  absl::StatusOr<at::Tensor> moments = ExecuteEncodePlan(encoder, counting, plan, cancelled);
  RETURN_IF_ERROR(counting.Synchronize());  // a queued collective's failure is the job's
  if (!moments.ok()) return moments.status();
  device::SynchronizeDevice(encoder.device());
  GroupDecodeResult figures;
  figures.mode = plan.mode;
  figures.decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (memory != nullptr) figures.peak_bytes = memory->peak_bytes();
  figures.comm_ms = counting.TakeCallMs();
  return std::make_pair(*std::move(moments), figures);
}

bool GroupRuntime::EncoderAgreed(int64_t model_index) {
  if (encoder_agreed_.empty()) encoder_agreed_.assign(models_.size(), false);
  return encoder_agreed_[model_index];
}

absl::StatusOr<EncodeOutcome> GroupRuntime::ExecuteEncode(families::Encoder& encoder, const GroupJob& job,
                                                          const std::atomic<bool>* cancelled) {
  // The image was validated and prepared before: a bad image never reaches the peers.
  ASSIGN_OR_RETURN(GroupJob shared, BroadcastJob(*comm_, &job));
  if (shared.encode.mode == DecodeMode::kExact && world_size_ > 1 && !EncoderAgreed(job.model_index)) {
    // Every rank loads its own encoder; all of them agree before the first
    // exact encode, so a rank that cannot (a file missing on its node, no
    // memory on its device) fails the request, not the group.
    ASSIGN_OR_RETURN(std::vector<int> failed, RanksWithoutTheirEncoder(*comm_, /*loaded=*/true));
    encoder_agreed_[job.model_index] = failed.empty();
    if (!failed.empty()) {
      return InStep(absl::FailedPreconditionError(absl::StrCat(
          "rank", failed.size() > 1 ? "s " : " ", absl::StrJoin(failed, ", "), " of the group could not load model \"",
          models_[job.model_index].name, "\"'s encoder (the worker log says why); the group keeps serving")));
    }
  }
  parallel::CountingCommunicator counting(*comm_);
  auto step = EncodeStep(encoder, counting, shared.encode, cancelled);
  if (!step.ok()) {
    if (world_size_ > 1 && shared.encode.mode == DecodeMode::kDense) {
      // The peers wait in the statistics gather that ends every job (as for a dense decode).
      ASSIGN_OR_RETURN(std::vector<RankStats> ranks, GatherRankStats(*comm_, GroupDecodeResult{}));
      return InStep(step.status());
    }
    return step.status();
  }
  EncodeOutcome outcome{step->first, shared.encode.mode, step->second.decode_ms, {}, counting.stats()};
  ASSIGN_OR_RETURN(outcome.ranks, GatherRankStats(*comm_, step->second));
  RecordStats(outcome.ranks);
  return outcome;
}

absl::StatusOr<GroupDecodeResult> GroupRuntime::ExecuteOnRank(const GroupJob& shared,
                                                              parallel::CountingCommunicator& counting,
                                                              const ExecuteOptions& options) {
  families::Decoder& decoder = *models_[shared.model_index].decoder;
  const SessionStep& step = shared.plan.session;
  // A dense chunk's state is the leader's alone.
  const bool holds_state = step.id != 0 && (rank_ == kLeader || shared.plan.mode == DecodeMode::kExact);
  ExecuteOptions with_stream = options;
  if (holds_state) {
    absl::StatusOr<families::DecodeStream*> stream = sessions_.Step(shared.plan, shared.model_index, decoder);
    // The leader checked before broadcasting: a peer without the state is out of step.
    if (!stream.ok()) return parallel::AbortWith(counting, absl::InternalError(stream.status().message()));
    with_stream.stream = *stream;
  }
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(decoder, counting, shared.plan, with_stream);
  if (holds_state) sessions_.Finish(step.id, result.ok());
  if (result.ok()) {
    result->session_state_bytes = sessions_.StateBytes(step.id);
    result->sessions_bytes = sessions_.TotalBytes();
  }
  return result;
}

absl::StatusOr<DecodeOutcome> GroupRuntime::Execute(const GroupJob& job, const std::atomic<bool>* cancelled,
                                                    const OutputProgress& progress) {
  if (job.model_index < 0 || job.model_index >= static_cast<int64_t>(models_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no model with index ", job.model_index));
  }
  const SessionStep& step = job.plan.session;
  if (step.id != 0) {
    // Before the peers hear of it, so a refusal leaves the group in step: a
    // lost state (the caller replays the session's history) or a chunk that
    // does not fit the session's state; tiles have no session state.
    RETURN_IF_ERROR(InStep(sessions_.Check(job.plan, job.model_index)));
    if (job.plan.mode == DecodeMode::kTiled) {
      return absl::InvalidArgumentError("a session's chunks are decoded dense or exact, not in tiles");
    }
    const int64_t replayed = step.replayed_latent_frames;
    if (replayed < 0 || (replayed > 0 && (!step.start || replayed >= job.plan.latent.size(2)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("a replay starts the session and leaves latent frames to return; it replays ", replayed, " of ",
                       job.plan.latent.size(2), step.start ? "" : " without starting the session"));
    }
  }
  families::Decoder& decoder = *models_[job.model_index].decoder;
  if (step.start) RETURN_IF_ERROR(InStep(decoder.CheckStreaming()));
  if (step.id != 0 && step.ends) {
    // A clip shorter than the model decodes (MiniMax-H3: a window) is the
    // request's error, found here rather than by every rank's stream.
    const int64_t clip = (step.start ? 0 : sessions_.LatentFrames(step.id).value_or(0)) + job.plan.latent.size(2);
    if (clip < decoder.info().min_latent_frames) {
      return InStep(absl::InvalidArgumentError(absl::StrCat("the session's clip ends with ", clip, " latent frames; ",
                                                            decoder.info().diffusers_class, " decodes at least ",
                                                            decoder.info().min_latent_frames)));
    }
  }
  // A replay's leading frames rebuild the state; the caller has their output.
  const int64_t skipped_frames = ReplayedOutputFrames(decoder, job.plan);
  OutputProgress chunk_progress = progress;
  if (skipped_frames > 0 && progress.frames_ready) {
    chunk_progress.frames_ready = [&progress, skipped_frames](const at::Tensor& frames, int64_t first_frame) {
      const int64_t end = first_frame + frames.size(2);
      if (end <= skipped_frames) return;
      const int64_t from = std::max<int64_t>(skipped_frames, first_frame);
      progress.frames_ready(frames.narrow(2, from - first_frame, end - from), from - skipped_frames);
    };
  }
  // The plan was validated and prepared before: a bad latent never reaches the peers.
  ASSIGN_OR_RETURN(GroupJob shared, BroadcastJob(*comm_, &job));
  parallel::CountingCommunicator counting(*comm_);
  absl::StatusOr<GroupDecodeResult> result = ExecuteOnRank(shared, counting, {cancelled, chunk_progress});
  if (result.ok() && skipped_frames > 0) {
    result->sample = result->sample.narrow(2, skipped_frames, result->sample.size(2) - skipped_frames);
  }
  if (!result.ok()) {
    if (world_size_ > 1 && IsLeaderOnlyRecoverable(result.status())) {
      // The peers are already in the statistics gather that ends every job:
      // complete it, so the group stays in step (before, a cancelled dense
      // decode left them there and the next job hung until the collective
      // timeout).
      ASSIGN_OR_RETURN(std::vector<RankStats> ranks, GatherRankStats(*comm_, GroupDecodeResult{}));
      return InStep(result.status());
    }
    return result.status();
  }
  DecodeOutcome outcome{*std::move(result), {}, counting.stats()};
  outcome.result.comm_ms = counting.TakeCallMs();
  absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, outcome.result);
  if (!ranks.ok()) {
    // The chunk did not reach its caller: a retry must replay, not go on
    // from the state it advanced (every rank drops it).
    if (step.id != 0) sessions_.Drop(step.id);
    return ranks.status();
  }
  outcome.ranks = *std::move(ranks);
  RecordStats(outcome.ranks);
  ++decodes_;
  return outcome;
}

GroupRuntime::Call::Call(GroupRuntime& runtime) : runtime_(runtime) {
  absl::MutexLock lock(&runtime_.idle_mu_);
  ++runtime_.calls_in_progress_;
}

GroupRuntime::Call::~Call() {
  absl::MutexLock lock(&runtime_.idle_mu_);
  --runtime_.calls_in_progress_;
}

bool GroupRuntime::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&idle_mu_);
  const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(idle_mu_) { return calls_in_progress_ == 0; };
  return idle_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

absl::Status GroupRuntime::CloseSession(int64_t id) {
  absl::MutexLock job_lock(&job_mu_);
  absl::MutexLock lock(&mu_);
  sessions_.Drop(id);
  if (broken_ || world_size_ == 1) return absl::OkStatus();
  GroupJob close;
  close.kind = JobKind::kSessionClose;
  close.plan.session.id = id;
  absl::StatusOr<GroupJob> sent = BroadcastJob(*comm_, &close);
  last_step_ = absl::Now();
  if (!sent.ok()) MarkBroken(sent.status());
  return sent.status();
}

void GroupRuntime::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  if (!broken_ && world_size_ > 1) {
    GroupJob stop;
    stop.kind = JobKind::kShutdown;
    absl::StatusOr<GroupJob> sent = BroadcastJob(*comm_, &stop);
    if (!sent.ok()) MarkBroken(sent.status());
  }
}

absl::Status GroupRuntime::ServeAsPeer() {
  while (true) {
    absl::StatusOr<GroupJob> job = BroadcastJob(*comm_, nullptr);
    if (!job.ok()) {
      MarkBroken(job.status());
      return job.status();
    }
    if (job->kind == JobKind::kHeartbeat) continue;
    if (job->kind == JobKind::kShutdown) return absl::OkStatus();
    if (job->model_index < 0 || job->model_index >= static_cast<int64_t>(models_.size())) {
      const absl::Status bad = absl::InternalError(absl::StrCat("the leader sent model index ", job->model_index));
      comm_->Abort(std::string(bad.message()));
      return bad;
    }
    if (job->kind == JobKind::kEncode) {
      if (absl::Status s = ServeEncode(*job); !s.ok()) return s;
      continue;
    }
    if (job->kind == JobKind::kSessionClose) {
      sessions_.Drop(job->plan.session.id);
      continue;
    }
    parallel::CountingCommunicator counting(*comm_);  // for the time the calls took
    absl::StatusOr<GroupDecodeResult> result = ExecuteOnRank(*job, counting, {});
    if (!result.ok()) {
      if (IsGroupSafe(result.status(), world_size_)) continue;  // every rank saw the same
      if (absl::Status s = RecoverOrBreak(result.status()); broken_) return s;
      continue;
    }
    result->comm_ms = counting.TakeCallMs();
    absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, *result);
    if (!ranks.ok()) {
      if (job->plan.session.id != 0) sessions_.Drop(job->plan.session.id);  // as the leader does
      if (absl::Status s = RecoverOrBreak(ranks.status()); broken_) return s;
      continue;
    }
    ++decodes_;
  }
}

absl::Status GroupRuntime::ServeEncode(const GroupJob& job) {
  if (job.encode.mode != DecodeMode::kExact) {
    // The leader encodes alone (it sent no image): meet it at the gather that ends every job.
    absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, GroupDecodeResult{});
    if (!ranks.ok()) {
      if (absl::Status s = RecoverOrBreak(ranks.status()); broken_) return s;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<families::Encoder*> encoder = Encoder(job.model_index);
  if (!EncoderAgreed(job.model_index)) {
    if (!encoder.ok()) {
      spdlog::warn("event=encoder_load_failed model={} rank={} error=\"{}\"", models_[job.model_index].name, rank_,
                   std::string(encoder.status().message()));
    }
    // Agreed with every rank (ExecuteEncode): if any could not load, none encodes.
    absl::StatusOr<std::vector<int>> failed = RanksWithoutTheirEncoder(*comm_, encoder.ok());
    if (!failed.ok()) {
      if (absl::Status s = RecoverOrBreak(failed.status()); broken_) return s;
      return absl::OkStatus();
    }
    encoder_agreed_[job.model_index] = failed->empty();
    if (!failed->empty()) return absl::OkStatus();
  }
  parallel::CountingCommunicator counting(*comm_);
  auto step = EncodeStep(**encoder, counting, job.encode, nullptr);
  if (!step.ok()) {
    if (IsGroupSafe(step.status(), world_size_)) return absl::OkStatus();
    if (absl::Status s = RecoverOrBreak(step.status()); broken_) return s;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, step->second);
  if (!ranks.ok()) {
    if (absl::Status s = RecoverOrBreak(ranks.status()); broken_) return s;
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::worker
