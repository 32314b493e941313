#pragma once

// The public vaedecode.v1.VaeDecoder service on gRPC's callback API.
//
// Decode: one reactor per call. The handler validates the request against
// the model (everything checkable before queueing), wraps it in a Job and
// queues it; it never blocks. A group's dispatcher thread later feeds the
// leader's stream into the Job, which keeps one write in flight on the
// reactor and a bounded buffer (finished output waits there, so a group is
// released when its decode is done; a client that stops reading is
// cancelled by the stall watch). OnCancel (client cancellation or the
// deadline) cancels the Job: out of the queue if queued, the leader's call
// if running. The reactor deletes itself in OnDone.
//
// DecodeSession: one bidirectional reactor per session
// (server/decode_session.cc); each chunk is a Job as a Decode is, pinned to
// the session's group.
//
// Encode: one bidirectional reactor per call reads the image's pieces (at
// most --max_message_bytes in all), then admits and queues the job as a
// Decode's; its output streams the same way.
//
// Every Decode and Encode, whatever its outcome, produces one structured
// info log line and counts in vaedecode_requests_total.
//
// Threading: the handlers run on gRPC's callback threads and only take
// short locks. StopAccepting/active_calls may be called from any thread.
// Ownership: scheduler, catalog and metrics are borrowed and must outlive
// the service and every call it started.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/collected_output.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/model_catalog.h"
#include "server/request_validation.h"
#include "server/scheduler.h"
#include "server/session_registry.h"
#include "vaedecode/v1/vaedecode.grpc.pb.h"

namespace vaedecode::server {

struct DecodeServiceOptions {
  int group_size = 1;  // every group's rank count (mode pre-check)
  // Larger requests are refused with RESOURCE_EXHAUSTED (gRPC's own limit is
  // set above it, so that refusals are counted and explained here).
  int64_t max_request_bytes = int64_t{64} << 20;
  AdmissionLimits admission;
  // Finished output waiting for slow clients: per call and in all. A call
  // past its share, or a server past the total, waits for its client (and
  // holds its group); a client that reads nothing for stream_stall_timeout
  // is cancelled, which frees both.
  int64_t max_call_output_bytes = int64_t{512} << 20;
  int64_t max_output_buffer_bytes = int64_t{2} << 30;
  absl::Duration stream_stall_timeout = absl::Seconds(30);
  // The most a call's output may wait for its client in all (the sum of its
  // writes' waits): a steady slow reader cannot hold a group, or buffered
  // output, longer than this.
  absl::Duration stream_read_timeout = absl::Seconds(120);
  // An Encode's image must have arrived (the client's half-close) within
  // this of the call's start, however it trickles; 0: no bound. gRPC's
  // upload watchdog cannot see it: the call's handler runs from its first
  // message on.
  absl::Duration upload_timeout = absl::Seconds(120);
  // DecodeSession's limits (server/session_registry.h).
  SessionLimits sessions;
};

// One Encode upload in progress, for the stall watch: it cancels the call
// once the upload has taken longer than upload_timeout.
struct UploadClock {
  absl::Mutex mu;
  grpc::CallbackServerContext* context ABSL_GUARDED_BY(mu) = nullptr;  // null once the upload is over
  absl::Time started;
  bool timed_out ABSL_GUARDED_BY(mu) = false;
};

// One DecodeSession call, for the stall watch: once the session has waited
// longer than `timeout` for its client's next message, the watch calls
// `end_idle` (under `mu`; the call clears it, under `mu`, before it is
// destroyed).
struct SessionClock {
  absl::Mutex mu;
  std::function<void()> end_idle ABSL_GUARDED_BY(mu);                     // empty once the call is over
  absl::Time waiting_since ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();  // reading the client's next message
  absl::Duration timeout ABSL_GUARDED_BY(mu);
  bool timed_out ABSL_GUARDED_BY(mu) = false;
};

class DecodeService final : public v1::VaeDecoder::CallbackService {
 public:
  DecodeService(DecodeServiceOptions options, Scheduler& scheduler, ModelCatalog& catalog, ServerMetrics& metrics);
  ~DecodeService() override;  // stops the stall watch

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* context,
                                                       const v1::DecodeRequest* request) override;
  grpc::ServerBidiReactor<v1::EncodeRequest, v1::DecodeResponse>* Encode(grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<v1::SessionRequest, v1::DecodeResponse>* DecodeSession(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context, const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context, const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;

  // One decode from any protocol (the gRPC Decode, the HTTP endpoint, the
  // Open Inference Protocol), in two steps so the caller can build its
  // stream around the Job: Admit validates the request (everything
  // checkable before queueing) and makes the Job; Start attaches `stream`
  // and queues the job, or finishes it at once with the refusal; the job
  // holds `keep_alive` (e.g. the stream itself) until it is destroyed.
  // `protocol` labels the log line and vaedecode_requests_total.
  struct Admission {
    std::shared_ptr<Job> job;
    absl::Status status;  // the refusal, if any
    std::string protocol;
  };
  Admission Admit(v1::DecodeRequest request, absl::Time received, absl::Time deadline, std::string protocol);
  // The same for an encode (its image whole); `refusal`, when not OK, is
  // the caller's own (an upload past --max_message_bytes).
  Admission AdmitEncode(v1::EncodeRequest request, absl::Time received, absl::Time deadline, std::string protocol,
                        absl::Status refusal = absl::OkStatus());
  void Start(const Admission& admission, JobStream* stream, std::shared_ptr<void> keep_alive = nullptr);

  // A whole decode for a unary protocol: admits, queues and waits for the
  // job, collecting its output in the server (at most `max_output_bytes` of
  // messages; beyond that the job is cancelled with RESOURCE_EXHAUSTED
  // pointing at the streaming Decode). `refusal`, when not OK, is the
  // caller's own reason to refuse a request that Admit accepted (it is
  // logged and counted like any refusal). Blocks the calling thread.
  CollectedOutput DecodeCollected(v1::DecodeRequest request, absl::Time deadline, std::string protocol,
                                  int64_t max_output_bytes, absl::Status refusal = absl::OkStatus());
  // The same without blocking: `done` runs once, on whichever thread ends
  // the job (possibly this one, before the return). The Job is returned so
  // the caller can Cancel it (its client went away).
  std::shared_ptr<Job> StartCollected(v1::DecodeRequest request, absl::Time deadline, std::string protocol,
                                      int64_t max_output_bytes, absl::Status refusal,
                                      std::function<void(CollectedOutput)> done);

  // The same for an encode (its image whole); `received` starts its clock.
  std::shared_ptr<Job> StartCollectedEncode(v1::EncodeRequest request, absl::Time received, absl::Time deadline,
                                            std::string protocol, int64_t max_output_bytes, absl::Status refusal,
                                            std::function<void(CollectedOutput)> done);

  // ---- for DecodeSession (server/decode_session.cc) ----------------------
  // The model's description; INVALID_ARGUMENT for an empty name, else as
  // the catalog says.
  absl::StatusOr<v1::ModelInfo> LookupModel(const std::string& name) const;
  const AdmissionLimits& admission_limits() const { return options_.admission; }
  int64_t max_request_bytes() const { return options_.max_request_bytes; }
  // Where sessions learn each group's memory (once, before serving).
  void SetGroupCapacity(SessionRegistry::GroupCapacity capacity) { sessions_->SetGroupCapacity(std::move(capacity)); }
  // Start for a session's chunk: no request log line or count of its own
  // (the session has one).
  void StartSessionJob(const Admission& admission, JobStream* stream, std::shared_ptr<void> keep_alive);
  // Queues the job that frees `session`'s state on its group; the session's
  // room in the registry is given back when that job is done.
  void CloseSessionState(const std::shared_ptr<SessionRecord>& session, const v1::ModelInfo& model);
  // Watches a DecodeSession call: the stall watch calls `end_idle` once it
  // has been idle too long.
  std::shared_ptr<SessionClock> WatchSession(std::function<void()> end_idle, absl::Duration timeout);

  // Watches an Encode upload that starts now (the stall watch cancels it
  // past upload_timeout); the reactor clears `context` when it ends.
  std::shared_ptr<UploadClock> WatchUpload(grpc::CallbackServerContext* context);
  absl::Duration upload_timeout() const { return options_.upload_timeout; }

  // From now on Decode answers UNAVAILABLE (draining).
  void StopAccepting();
  // Ends every call not yet done with `reason` (the drain timeout's own
  // message, instead of gRPC's "Cancelling all calls" at shutdown).
  void CancelAll(const absl::Status& reason);
  // Decode calls started and not yet done (OnDone), and collected decodes
  // not yet returned.
  int64_t active_calls() const { return active_.load(); }

 private:
  // Starts an admitted job whose output is collected for `done`.
  std::shared_ptr<Job> StartCollecting(const Admission& admission, int64_t max_output_bytes,
                                       std::function<void(CollectedOutput)> done);
  // The log line and metrics for a finished call.
  void Report(const Job& job, const absl::Status& status, const std::string& protocol);
  void ReportEncode(const Job& job, const absl::Status& status, const std::string& protocol);
  // Every 250 ms: cancels calls whose client has not taken a write for
  // stream_stall_timeout, and publishes the output buffer's size.
  void StallWatchLoop();
  // Cancels Encode uploads still arriving past upload_timeout.
  void CutSlowUploads(absl::Time now);
  // Ends sessions whose client has sent nothing for their idle timeout.
  void CutIdleSessions(absl::Time now);
  // Attaches `stream` and queues the admitted job, or finishes it with its refusal.
  void StartJob(const Admission& admission, JobStream* stream, Job::DoneCallback done);

  const DecodeServiceOptions options_;
  Scheduler& scheduler_;
  ModelCatalog& catalog_;
  ServerMetrics& metrics_;
  std::atomic<bool> accepting_{true};
  std::atomic<int64_t> active_{0};
  OutputBudget output_budget_;
  // Shared with the session close jobs, which give a session's room back
  // once its state is freed (server/session_close.h), maybe after this service.
  std::shared_ptr<SessionRegistry> sessions_;

  absl::Mutex watch_mu_;
  std::vector<std::weak_ptr<Job>> watched_ ABSL_GUARDED_BY(watch_mu_);
  std::vector<std::shared_ptr<UploadClock>> uploads_ ABSL_GUARDED_BY(watch_mu_);
  std::vector<std::shared_ptr<SessionClock>> session_clocks_ ABSL_GUARDED_BY(watch_mu_);
  bool stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread stall_watch_;
};

}  // namespace vaedecode::server
