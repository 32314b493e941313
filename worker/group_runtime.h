#pragma once

// One rank's side of a long-lived worker group: the models, the communicator
// and the protocol that keeps every rank in step.
//
// Leader (rank 0): Run() executes one job at a time (callers from any thread
// queue on a mutex), and a heartbeat thread broadcasts a heartbeat whenever
// the group has been idle for `heartbeat`, so peers waiting for work never
// reach the communicator's timeout. Peers: ServeAsPeer() follows the leader
// until it broadcasts a shutdown or the group fails.
//
// Fail-stop: an error other than INVALID_ARGUMENT (which every rank detects
// identically before any collective) or CANCELLED (which every rank learns in
// the same collective) may leave the ranks out of step. With a GroupRecovery
// the ranks first try to re-form the communicator in place (an out-of-memory
// on one rank of an exact decode: group_recovery.h); otherwise, or when that
// fails, the runtime marks itself broken; its process should exit and the
// supervisor rebuilds the group.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "families/encoder.h"
#include "parallel/communicator.h"
#include "parallel/counting_communicator.h"
#include "worker/encode_memory.h"
#include "worker/group_decode.h"
#include "worker/group_encode.h"
#include "worker/group_job.h"
#include "worker/group_recovery.h"
#include "worker/model_repository.h"
#include "worker/output_progress.h"
#include "worker/session_streams.h"

namespace vaedecode::worker {

struct DecodeOutcome {
  GroupDecodeResult result;      // the whole sample (leader)
  std::vector<RankStats> ranks;  // every rank's time and peak memory
  parallel::CommStats comm;      // the leader's calls during the decode
};

struct EncodeOutcome {
  at::Tensor moments;  // the whole image's (leader)
  DecodeMode mode = DecodeMode::kDense;
  double encode_ms = 0;          // the leader's encode, the row gather included
  std::vector<RankStats> ranks;  // every rank's time and peak memory
  parallel::CommStats comm;      // the leader's calls during the encode
};

// The output frames of a session replay's leading latent frames, which the
// leader decodes and does not return (0 for any other plan).
int64_t ReplayedOutputFrames(const families::Decoder& decoder, const DecodePlan& plan);

class GroupRuntime {
 public:
  // `recovery` (every rank alike, or none) re-forms the communicator after
  // a failure every rank survived; without it such a failure breaks the group.
  GroupRuntime(std::unique_ptr<parallel::Communicator> comm, std::vector<NamedModel> models, absl::Duration heartbeat,
               std::unique_ptr<GroupRecovery> recovery = nullptr);
  ~GroupRuntime();  // leader: stops the heartbeat thread (call Shutdown first to release peers)

  // Leader only. Thread-safe; blocks until the job (its plan made by
  // PlanDecode for this group) has run on the group. Setting *cancelled
  // stops it on every rank (CANCELLED) without breaking the group.
  // `progress` sees parts of the output as they become final (output_progress.h).
  absl::StatusOr<DecodeOutcome> Run(const GroupJob& job, const std::atomic<bool>* cancelled = nullptr,
                                    const OutputProgress& progress = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Leader: the encoder of model `model_index`, loaded from its folder on
  // first use (LoadEncoderFor; every peer loads its own when the model's
  // first encode job arrives), so decode-only models never hold one.
  // Thread-safe; FAILED_PRECONDITION for a model that cannot encode.
  absl::StatusOr<families::Encoder*> Encoder(int64_t model_index) ABSL_LOCKS_EXCLUDED(encoders_mu_);

  // Leader: what an encode of model `model_index` may use and needs, between
  // jobs: its measured peaks (encode_memory.h; calibrated through the
  // process's device memory meter on the first call, all zeros without
  // one), and every rank's free bytes now: the leader's read live (its
  // encoder loaded), a peer's as last reported less the encoder's weights
  // while the peers have not loaded it yet (they do with the model's first
  // encode); −1 for ranks without a bound.
  struct EncodeRoom {
    EncodePeakModel peak;
    std::vector<int64_t> free_bytes_per_rank;
  };
  absl::StatusOr<EncodeRoom> EncodeRoomFor(int64_t model_index) ABSL_LOCKS_EXCLUDED(job_mu_);

  // Leader only: a dense decode of model `model_index` on the leader alone,
  // between the group's jobs (an audio track muxed beside a video: small, no
  // collectives, the peers untouched). A refusal, cancel or lack of memory
  // is the request's; any other failure (the device's) breaks the group, as
  // a failed job's would.
  absl::StatusOr<at::Tensor> DecodeOnLeader(int64_t model_index, const DecodeJob& job,
                                            const std::atomic<bool>* cancelled = nullptr) ABSL_LOCKS_EXCLUDED(job_mu_);

  // Leader only. As Run, for an encode job (kind kEncode; its plan made by
  // PlanEncode from an image prepared for Encoder(model_index)).
  absl::StatusOr<EncodeOutcome> RunEncode(const GroupJob& job, const std::atomic<bool>* cancelled = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Leader: one call that works on the group (the Run handler, from its
  // first byte to its last write: the output stays on the device until
  // then), while it lives.
  class Call {
   public:
    explicit Call(GroupRuntime& runtime);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    GroupRuntime& runtime_;
  };
  // Leader: waits up to `timeout` until no Call is in progress (a cancelled
  // job stops at its next op or collective); whether none is.
  bool WaitIdle(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(idle_mu_);

  // Leader: ends streaming session `id` on every rank, freeing its state
  // (a no-op where none is held). Thread-safe; queues like a job.
  absl::Status CloseSession(int64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // This rank's streaming sessions (a session chunk is a Run job whose
  // plan has a SessionStep): their figures, readable at any time.
  const SessionStreams& sessions() const { return sessions_; }

  // Leader: every rank's free bytes as last reported (after start-up and
  // after every group decode); -1 entries for ranks without a budget.
  std::vector<int64_t> free_bytes_per_rank() const ABSL_LOCKS_EXCLUDED(stats_mu_);
  // Leader: every rank's capacity as last reported (DeviceMemory::capacity_bytes).
  std::vector<int64_t> capacity_bytes_per_rank() const ABSL_LOCKS_EXCLUDED(stats_mu_);

  // Leader only: tells the peers to exit, then stops the heartbeats.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Peers only: returns OK after a shutdown job, the error otherwise.
  absl::Status ServeAsPeer();

  bool broken() const { return broken_.load(); }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // The group's device (the communicator's): CPU, or this rank's GPU.
  c10::Device device() const { return device_; }
  int64_t decodes() const { return decodes_.load(); }
  const std::vector<NamedModel>& models() const { return models_; }
  // Index of the model called `name`, or -1.
  int FindModel(const std::string& name) const;

 private:
  absl::StatusOr<DecodeOutcome> Execute(const GroupJob& job, const std::atomic<bool>* cancelled,
                                        const OutputProgress& progress) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any rank: runs a broadcast decode plan, through its session's stream
  // when it is a session's chunk (kept, or dropped when the chunk fails);
  // the figures of the job's session and of all sessions in the result.
  absl::StatusOr<GroupDecodeResult> ExecuteOnRank(const GroupJob& shared, parallel::CountingCommunicator& counting,
                                                  const ExecuteOptions& options);
  absl::StatusOr<EncodeOutcome> ExecuteEncode(families::Encoder& encoder, const GroupJob& job,
                                              const std::atomic<bool>* cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // This rank's part of a broadcast encode plan, timed (its figures for
  // GatherRankStats); the moments on the leader.
  absl::StatusOr<std::pair<at::Tensor, GroupDecodeResult>> EncodeStep(families::Encoder& encoder,
                                                                      parallel::CountingCommunicator& counting,
                                                                      const EncodePlan& plan,
                                                                      const std::atomic<bool>* cancelled);
  // The answer to a job that failed with `failure` (group-safe errors as
  // they are; otherwise recovered in place or the group marked broken).
  absl::Status AnswerFailure(const absl::Status& failure);
  // Peers: an encode job; an error only when this rank cannot go on.
  absl::Status ServeEncode(const GroupJob& job);
  // Whether every rank has confirmed model `model_index`'s encoder loaded
  // (then exact encodes skip the agreement).
  bool EncoderAgreed(int64_t model_index);
  void HeartbeatLoop();
  void MarkBroken(const absl::Status& why);
  // After a failure the group cannot serve on: the status to answer the job
  // with if the group re-formed in place (in step), else marks it broken and
  // returns `failure`.
  absl::Status RecoverOrBreak(const absl::Status& failure);

  // Replaced only by a recovery (under mu_ on the leader; peers have one thread).
  std::unique_ptr<parallel::Communicator> comm_;
  const int rank_;
  const int world_size_;
  const c10::Device device_;
  const std::unique_ptr<GroupRecovery> recovery_;
  const std::vector<NamedModel> models_;
  const absl::Duration heartbeat_;

  void RecordStats(const std::vector<RankStats>& ranks) ABSL_LOCKS_EXCLUDED(stats_mu_);

  absl::Mutex job_mu_;  // one job at a time (group or local), in arrival order
  absl::Mutex mu_;      // one step of the protocol at a time
  mutable absl::Mutex stats_mu_;
  std::vector<RankStats> rank_stats_ ABSL_GUARDED_BY(stats_mu_);
  absl::Time last_step_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeat_thread_;

  std::atomic<bool> broken_{false};
  std::atomic<int64_t> decodes_{0};
  absl::Mutex encoders_mu_;
  // By model index; null until a model's first encode.
  std::vector<std::unique_ptr<families::Encoder>> encoders_ ABSL_GUARDED_BY(encoders_mu_);
  // Models whose encoder every rank has confirmed loaded (each rank keeps
  // the same list: it changes only on an agreement all of them saw). Only
  // the thread running group jobs touches it (the leader's under mu_).
  std::vector<bool> encoder_agreed_;
  // By model index; empty until a model's first EncodePeak.
  std::vector<std::optional<EncodePeakModel>> encode_peaks_ ABSL_GUARDED_BY(job_mu_);
  absl::Mutex idle_mu_;
  int calls_in_progress_ ABSL_GUARDED_BY(idle_mu_) = 0;
  SessionStreams sessions_;
};

}  // namespace vaedecode::worker
