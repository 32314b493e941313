#include "worker/group_runtime.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
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
  if (s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kCancelled) return true;
  return s.code() == absl::StatusCode::kResourceExhausted && (world_size == 1 || IsInStep(s));
}

// A failure the leader alone saw (marked LeaderOnly by the dense path: the
// peers wait in the statistics gather meanwhile) and can recover from.
bool IsLeaderOnlyRecoverable(const absl::Status& s) {
  return IsLeaderOnly(s) &&
         (s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kResourceExhausted ||
          s.code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace

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
  if (outcome.ok() || IsGroupSafe(outcome.status(), world_size_)) return outcome;
  const absl::Status answer = RecoverOrBreak(outcome.status());
  if (!broken_) return answer;
  // A collective that timed out is the group's failure, not the caller's
  // deadline (the server rebuilds the group; the client may retry).
  if (absl::IsDeadlineExceeded(outcome.status())) {
    return absl::UnavailableError(absl::StrCat("the worker group failed: ", outcome.status().message()));
  }
  return outcome;
}

absl::StatusOr<DecodeOutcome> GroupRuntime::Execute(const GroupJob& job, const std::atomic<bool>* cancelled,
                                                    const OutputProgress& progress) {
  if (job.model_index < 0 || job.model_index >= static_cast<int64_t>(models_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no model with index ", job.model_index));
  }
  families::Decoder& decoder = *models_[job.model_index].decoder;
  // The plan was validated and prepared before: a bad latent never reaches the peers.
  ASSIGN_OR_RETURN(GroupJob shared, BroadcastJob(*comm_, &job));
  parallel::CountingCommunicator counting(*comm_);
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(decoder, counting, shared.plan, {cancelled, progress});
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
  ASSIGN_OR_RETURN(std::vector<RankStats> ranks, GatherRankStats(*comm_, outcome.result));
  outcome.ranks = std::move(ranks);
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
    families::Decoder& decoder = *models_[job->model_index].decoder;
    parallel::CountingCommunicator counting(*comm_);  // for the time the calls took
    absl::StatusOr<GroupDecodeResult> result = ExecutePlan(decoder, counting, job->plan);
    if (!result.ok()) {
      if (IsGroupSafe(result.status(), world_size_)) continue;  // every rank saw the same
      if (absl::Status s = RecoverOrBreak(result.status()); broken_) return s;
      continue;
    }
    result->comm_ms = counting.TakeCallMs();
    absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm_, *result);
    if (!ranks.ok()) {
      if (absl::Status s = RecoverOrBreak(ranks.status()); broken_) return s;
      continue;
    }
    ++decodes_;
  }
}

}  // namespace vaedecode::worker
