#include "server/decode_service.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "rpc/log_field.h"
#include "rpc/request_checks.h"
#include "rpc/status.h"
#include "rpc/status_macros.h"
#include "server/mode_selection.h"
#include "server/request_validation.h"
#include "server/session_close.h"

namespace vaedecode::server {
namespace {

std::string NewRequestId() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrFormat("%016x", gen());
}

std::string Shape(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

// "[12.3,4.5]": one figure per rank, to a tenth of a millisecond.
std::string Milliseconds(const std::vector<double>& ms) {
  return absl::StrCat(
      "[", absl::StrJoin(ms, ",", [](std::string* out, double v) { absl::StrAppend(out, absl::StrFormat("%.1f", v)); }),
      "]");
}

// A call's transport was cancelled: why, for the Job. A client whose
// deadline passes cancels the call itself, a little before the server's
// copy of the deadline (which starts when the call arrives): a cancellation
// that close to the deadline is the deadline. `accepting`: false once the
// server drains, so a cancellation then is the drain timeout cutting it.
void CancelForTransport(Job& job, const std::atomic<bool>& accepting) {
  if (job.DeadlinePassed()) {
    job.Cancel(absl::DeadlineExceededError(
        absl::StrCat("deadline exceeded after ", absl::FormatDuration(absl::Now() - job.received()))));
  } else if (!accepting.load()) {
    job.Cancel(absl::UnavailableError("the server is draining and its drain timeout cut the call"));
  } else {
    job.Cancel(absl::CancelledError("cancelled by the client"));
  }
}

// One reactor per Decode call; the Job holds the call's state.
class DecodeReactor final : public grpc::ServerWriteReactor<v1::DecodeResponse>, public JobStream {
 public:
  // `accepting` is the service's flag: false once the server drains, so a
  // cancellation after that is the drain timeout cutting the call.
  DecodeReactor(grpc::CallbackServerContext* context, std::shared_ptr<Job> job, std::atomic<int64_t>& active,
                const std::atomic<bool>& accepting)
      : context_(context), job_(std::move(job)), active_(active), accepting_(accepting) {
    active_.fetch_add(1);
  }

  // JobStream: the Job drives the stream.
  void StartWrite(const v1::DecodeResponse* message) override {
    grpc::ServerWriteReactor<v1::DecodeResponse>::StartWrite(message);
  }
  void Finish(const absl::Status& status) override {
    grpc::ServerWriteReactor<v1::DecodeResponse>::Finish(rpc::ToGrpcStatus(status));
  }
  void Abort() override { context_->TryCancel(); }

  void OnWriteDone(bool ok) override { job_->OnWriteDone(ok); }

  void OnCancel() override { CancelForTransport(*job_, accepting_); }

  void OnDone() override {
    active_.fetch_sub(1);
    delete this;
  }

 private:
  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<Job> job_;
  std::atomic<int64_t>& active_;
  const std::atomic<bool>& accepting_;
};

// One reactor per Encode call: reads the image's pieces, then the Job
// drives the stream as a Decode's.
class EncodeReactor final : public grpc::ServerBidiReactor<v1::EncodeRequest, v1::DecodeResponse>, public JobStream {
 public:
  EncodeReactor(grpc::CallbackServerContext* context, DecodeService& service, int64_t max_bytes,
                std::atomic<int64_t>& active, const std::atomic<bool>& accepting)
      : context_(context),
        service_(service),
        max_bytes_(max_bytes),
        received_(absl::Now()),
        active_(active),
        accepting_(accepting),
        upload_(service.WatchUpload(context)) {
    active_.fetch_add(1);
    StartRead(&piece_);
  }

  void OnReadDone(bool ok) override {
    if (ok && pieces_++ > 0) {
      // A later piece continues the first message's image bytes.
      if (!piece_.encoded_image().empty()) request_.mutable_encoded_image()->append(piece_.encoded_image());
      if (piece_.has_image()) request_.mutable_image()->mutable_data()->append(piece_.image().data());
    } else if (ok) {
      request_ = std::move(piece_);
    }
    piece_.Clear();
    const int64_t bytes = static_cast<int64_t>(request_.ByteSizeLong());
    const absl::Duration limit = service_.upload_timeout();
    const bool too_slow = limit > absl::ZeroDuration() && absl::Now() - received_ > limit;
    if (ok && bytes <= max_bytes_ && !too_slow) {
      StartRead(&piece_);
      return;
    }
    bool timed_out = too_slow;
    {
      absl::MutexLock lock(&upload_->mu);
      upload_->context = nullptr;  // the upload is over: the watch lets go of the call
      timed_out = timed_out || upload_->timed_out;
    }
    absl::Status refusal;
    if (timed_out) {
      refusal =
          absl::DeadlineExceededError(absl::StrCat("the image was still arriving after ", absl::FormatDuration(limit),
                                                   " (--upload_timeout_s); the server refused the call"));
    } else if (ok) {
      refusal = absl::ResourceExhaustedError(absl::StrCat("the image is more than ", max_bytes_,
                                                          " bytes, this server's --max_message_bytes; send a smaller "
                                                          "image or clip"));
    } else if (context_->IsCancelled()) {
      refusal = absl::Now() >= rpc::CallDeadline(*context_)
                    ? absl::DeadlineExceededError("deadline exceeded while the image was being sent")
                    : absl::CancelledError("cancelled by the client while sending the image");
    }
    DecodeService::Admission admission =
        service_.AdmitEncode(std::move(request_), received_, rpc::CallDeadline(*context_), "grpc", refusal);
    {
      // Published before Start: the job may write (OnWriteDone finds it) as
      // soon as it is queued. A cancel that arrives meanwhile waits for Start
      // to attach the stream, then cancels.
      absl::MutexLock lock(&mu_);
      job_ = admission.job;
    }
    service_.Start(admission, this);
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      started_ = true;
      cancel = cancel_pending_;
    }
    if (cancel) CancelForTransport(*admission.job, accepting_);
  }

  void StartWrite(const v1::DecodeResponse* message) override {
    grpc::ServerBidiReactor<v1::EncodeRequest, v1::DecodeResponse>::StartWrite(message);
  }
  void Finish(const absl::Status& status) override {
    grpc::ServerBidiReactor<v1::EncodeRequest, v1::DecodeResponse>::Finish(rpc::ToGrpcStatus(status));
  }
  void Abort() override { context_->TryCancel(); }
  void OnWriteDone(bool ok) override { Job()->OnWriteDone(ok); }

  void OnCancel() override {
    std::shared_ptr<server::Job> job;
    {
      absl::MutexLock lock(&mu_);
      // Still reading (the read fails and admission says why), or the job is
      // not attached yet (OnReadDone cancels it once it is).
      if (!started_) {
        cancel_pending_ = true;
        return;
      }
      job = job_;
    }
    CancelForTransport(*job, accepting_);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&upload_->mu);
      upload_->context = nullptr;
    }
    active_.fetch_sub(1);
    delete this;
  }

 private:
  std::shared_ptr<server::Job> Job() {
    absl::MutexLock lock(&mu_);
    return job_;
  }

  grpc::CallbackServerContext* const context_;
  DecodeService& service_;
  const int64_t max_bytes_;
  const absl::Time received_;
  std::atomic<int64_t>& active_;
  const std::atomic<bool>& accepting_;
  const std::shared_ptr<UploadClock> upload_;
  v1::EncodeRequest piece_;    // the read in flight
  v1::EncodeRequest request_;  // the first message, its image continued by the later ones
  int64_t pieces_ = 0;
  absl::Mutex mu_;
  std::shared_ptr<server::Job> job_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;         // the job is attached and queued (or refused)
  bool cancel_pending_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel came before that
};

}  // namespace

DecodeService::DecodeService(DecodeServiceOptions options, Scheduler& scheduler, ModelCatalog& catalog,
                             ServerMetrics& metrics)
    : options_(std::move(options)),
      scheduler_(scheduler),
      catalog_(catalog),
      metrics_(metrics),
      output_budget_(options_.max_output_buffer_bytes),
      sessions_(std::make_shared<SessionRegistry>(options_.sessions, catalog)) {
  stall_watch_ = std::thread([this] { StallWatchLoop(); });
}

DecodeService::~DecodeService() {
  {
    absl::MutexLock lock(&watch_mu_);
    stopping_ = true;
  }
  stall_watch_.join();
}

void DecodeService::CancelAll(const absl::Status& reason) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&watch_mu_);
    for (const std::weak_ptr<Job>& w : watched_) {
      if (std::shared_ptr<Job> j = w.lock()) jobs.push_back(std::move(j));
    }
  }
  for (const std::shared_ptr<Job>& job : jobs) job->Cancel(reason);
}

void DecodeService::StallWatchLoop() {
  constexpr absl::Duration kPeriod = absl::Milliseconds(250);
  while (true) {
    std::vector<std::shared_ptr<Job>> jobs;
    {
      absl::MutexLock lock(&watch_mu_);
      watch_mu_.AwaitWithTimeout(absl::Condition(&stopping_), kPeriod);
      if (stopping_) return;
      std::vector<std::weak_ptr<Job>> alive;
      for (const std::weak_ptr<Job>& w : watched_) {
        if (std::shared_ptr<Job> j = w.lock()) {
          jobs.push_back(std::move(j));
          alive.push_back(w);
        }
      }
      watched_ = std::move(alive);
    }
    metrics_.SetOutputBufferBytes(output_budget_.used());
    const absl::Time now = absl::Now();
    CutSlowUploads(now);
    CutIdleSessions(now);
    for (const std::shared_ptr<Job>& job : jobs) {
      const absl::Duration stalled = job->WriteStalledFor(now);
      const absl::Duration waited = job->WriteWaitTotal(now);
      if (stalled >= options_.stream_stall_timeout) {
        metrics_.RecordStalledStream();
        job->AbortStalled(absl::CancelledError(absl::StrCat(
            "the client read nothing for ", absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(100))),
            "; the server cancelled the stream (--stream_stall_timeout_s)")));
      } else if (waited >= options_.stream_read_timeout) {
        metrics_.RecordStalledStream();
        job->AbortStalled(absl::CancelledError(
            absl::StrCat("the client read too slowly: the output waited ",
                         absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(100))),
                         " for it in all; the server cancelled the stream (--stream_read_timeout_s)")));
      }
    }
  }
}

std::shared_ptr<UploadClock> DecodeService::WatchUpload(grpc::CallbackServerContext* context) {
  auto clock = std::make_shared<UploadClock>();
  clock->started = absl::Now();
  {
    absl::MutexLock lock(&clock->mu);
    clock->context = context;
  }
  if (options_.upload_timeout > absl::ZeroDuration()) {
    absl::MutexLock lock(&watch_mu_);
    uploads_.push_back(clock);
  }
  return clock;
}

void DecodeService::CutSlowUploads(absl::Time now) {
  std::vector<std::shared_ptr<UploadClock>> uploads;
  {
    absl::MutexLock lock(&watch_mu_);
    uploads.swap(uploads_);
  }
  std::vector<std::shared_ptr<UploadClock>> going_on;
  for (const std::shared_ptr<UploadClock>& clock : uploads) {
    absl::MutexLock lock(&clock->mu);
    if (clock->context == nullptr) continue;  // over
    if (now - clock->started <= options_.upload_timeout) {
      going_on.push_back(clock);
      continue;
    }
    // The read in flight fails; the reactor refuses the call, naming the flag.
    clock->timed_out = true;
    clock->context->TryCancel();
    metrics_.RecordRejected("upload_timeout");
    spdlog::info("event=upload_timeout protocol=grpc op=encode waited_s={:.0f}",
                 absl::ToDoubleSeconds(now - clock->started));
  }
  absl::MutexLock lock(&watch_mu_);
  uploads_.insert(uploads_.end(), going_on.begin(), going_on.end());
}

std::shared_ptr<SessionClock> DecodeService::WatchSession(std::function<void()> end_idle, absl::Duration timeout) {
  auto clock = std::make_shared<SessionClock>();
  {
    absl::MutexLock lock(&clock->mu);
    clock->end_idle = std::move(end_idle);
    clock->waiting_since = absl::Now();  // for the open
    clock->timeout = timeout;
  }
  absl::MutexLock lock(&watch_mu_);
  session_clocks_.push_back(clock);
  return clock;
}

void DecodeService::CutIdleSessions(absl::Time now) {
  std::vector<std::shared_ptr<SessionClock>> clocks;
  {
    absl::MutexLock lock(&watch_mu_);
    clocks.swap(session_clocks_);
  }
  std::vector<std::shared_ptr<SessionClock>> going_on;
  for (const std::shared_ptr<SessionClock>& clock : clocks) {
    absl::MutexLock lock(&clock->mu);
    if (!clock->end_idle) continue;  // over
    going_on.push_back(clock);
    if (clock->timed_out || now - clock->waiting_since <= clock->timeout) continue;
    // The session ends with its own status (a cancelled call would reach
    // the client as a bare CANCELLED); the read in flight then fails.
    clock->timed_out = true;
    clock->end_idle();
  }
  absl::MutexLock lock(&watch_mu_);
  session_clocks_.insert(session_clocks_.end(), going_on.begin(), going_on.end());
}

absl::StatusOr<v1::ModelInfo> DecodeService::LookupModel(const std::string& name) const {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: empty; available models: ", absl::StrJoin(catalog_.Names(), ", ")));
  }
  return catalog_.Lookup(name);
}

void DecodeService::StartSessionJob(const Admission& admission, JobStream* stream, std::shared_ptr<void> keep_alive) {
  StartJob(admission, stream, [this, keep_alive = std::move(keep_alive)](const Job& j, const absl::Status& s) {
    if (j.TakePending()) metrics_.AddPending(j.model().name(), -1);
    const JobReport r = j.report();
    spdlog::debug("session_chunk id={} queue_ms={:.1f} decode_ms={:.1f} stream_ms={:.1f} status={}",
                  rpc::LogValue(j.request_id()), r.timings.queue_ms(), r.timings.decode_ms(), r.timings.stream_ms(),
                  rpc::StatusCodeName(s.code()));
  });
}

void DecodeService::CloseSessionState(const std::shared_ptr<SessionRecord>& session, const v1::ModelInfo& model) {
  const std::shared_ptr<Job> job = MakeSessionCloseJob(session, model, sessions_);
  // Ahead of the queue and past its bound: it frees memory, and takes none.
  if (!scheduler_.Requeue(job)) job->Finish(absl::UnavailableError("the server is stopping"));
}

void DecodeService::StopAccepting() { accepting_.store(false); }

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(grpc::CallbackServerContext* context,
                                                                    const v1::DecodeRequest* request) {
  Admission admission = Admit(*request, absl::Now(), rpc::CallDeadline(*context), "grpc");
  auto* reactor = new DecodeReactor(context, admission.job, active_, accepting_);
  Start(admission, reactor);
  return reactor;
}

grpc::ServerBidiReactor<v1::EncodeRequest, v1::DecodeResponse>* DecodeService::Encode(
    grpc::CallbackServerContext* context) {
  return new EncodeReactor(context, *this, options_.max_request_bytes, active_, accepting_);
}

DecodeService::Admission DecodeService::AdmitEncode(v1::EncodeRequest request, absl::Time received, absl::Time deadline,
                                                    std::string protocol, absl::Status refusal) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  absl::Status status = std::move(refusal);
  v1::ModelInfo model;
  if (status.ok() && !accepting_.load()) {
    status = absl::UnavailableError("the server is draining; retry on another replica");
  } else if (status.code() == absl::StatusCode::kResourceExhausted) {
    metrics_.RecordRejected("message_too_large");
  } else if (status.ok() && request.model().empty()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("model: empty; available models: ", absl::StrJoin(catalog_.Names(), ", ")));
  } else if (status.ok()) {
    absl::StatusOr<v1::ModelInfo> found = catalog_.Lookup(request.model());
    if (found.ok()) {
      model = *std::move(found);
      status = ValidateEncodeRequest(request, model, options_.group_size, options_.admission);
    } else {
      status = found.status();
    }
  }
  v1::DecodeRequest envelope;
  envelope.set_model(request.model());
  envelope.set_request_id(request.request_id());
  envelope.set_mode(request.mode());
  envelope.set_output_format(v1::OUTPUT_FLOAT32);
  JobBuffering buffering;
  buffering.max_call_bytes = options_.max_call_output_bytes;
  buffering.budget = &output_budget_;
  Admission admission;
  admission.job =
      std::make_shared<Job>(std::move(envelope), std::move(request), std::move(model), received, deadline, buffering);
  admission.status = std::move(status);
  admission.protocol = std::move(protocol);
  return admission;
}

DecodeService::Admission DecodeService::Admit(v1::DecodeRequest request, absl::Time received, absl::Time deadline,
                                              std::string protocol) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());

  absl::Status status;
  v1::ModelInfo model;
  const int64_t request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  if (!accepting_.load()) {
    status = absl::UnavailableError("the server is draining; retry on another replica");
  } else if (request_bytes > options_.max_request_bytes) {
    metrics_.RecordRejected("message_too_large");
    status = absl::ResourceExhaustedError(absl::StrCat("the request is ", request_bytes,
                                                       " bytes, more than this server's --max_message_bytes=",
                                                       options_.max_request_bytes, "; send a smaller batch or clip"));
  } else if (request.model().empty()) {
    status = absl::InvalidArgumentError(
        absl::StrCat("model: empty; available models: ", absl::StrJoin(catalog_.Names(), ", ")));
  } else {
    absl::StatusOr<v1::ModelInfo> found = catalog_.Lookup(request.model());
    if (found.ok()) {
      model = *std::move(found);
      status = ValidateDecodeRequest(request, model);
      if (status.ok() && rpc::HasMuxedAudio(request)) {
        status = ValidateMuxedAudio(request, catalog_.Lookup(request.audio_model()), options_.admission);
      }
      if (status.ok()) status = CheckAdmission(request, model, options_.admission);
      if (status.ok()) {
        GroupResources every_group;
        every_group.degree = options_.group_size;
        status = SelectMode(request, model, every_group).status();
      }
    } else {
      status = found.status();
    }
  }

  JobBuffering buffering;
  buffering.max_call_bytes = options_.max_call_output_bytes;
  buffering.budget = &output_budget_;
  Admission admission;
  admission.job = std::make_shared<Job>(std::move(request), std::move(model), received, deadline, buffering);
  admission.status = std::move(status);
  admission.protocol = std::move(protocol);
  return admission;
}

void DecodeService::Start(const Admission& admission, JobStream* stream, std::shared_ptr<void> keep_alive) {
  StartJob(admission, stream,
           [this, protocol = admission.protocol, keep_alive = std::move(keep_alive)](
               const Job& j, const absl::Status& s) { Report(j, s, protocol); });
}

void DecodeService::StartJob(const Admission& admission, JobStream* stream, Job::DoneCallback done) {
  const std::shared_ptr<Job>& job = admission.job;
  job->Attach(stream, std::move(done));
  absl::Status status = admission.status;
  if (status.ok()) {
    {
      absl::MutexLock lock(&watch_mu_);
      watched_.push_back(job);
    }
    job->MarkPending();
    metrics_.AddPending(job->model().name(), 1);
    status = scheduler_.Enqueue(job);
  }
  if (!status.ok()) job->Finish(status);
}

void DecodeService::Report(const Job& job, const absl::Status& status, const std::string& protocol) {
  if (job.encode() != nullptr) return ReportEncode(job, status, protocol);
  const JobReport r = job.report();
  const double total_ms = absl::ToDoubleMilliseconds(absl::Now() - job.received());
  const v1::DecodeRequest& req = job.request();
  std::vector<int64_t> latent(req.latent().shape().begin(), req.latent().shape().end());
  const std::string model = job.model().name().empty() ? "_unknown" : job.model().name();
  if (job.TakePending()) metrics_.AddPending(job.model().name(), -1);
  const int64_t batch = req.latent().shape_size() > 0 ? req.latent().shape(0) : 1;
  metrics_.RecordRequest(model, protocol, status.code(), batch, total_ms / 1000, r.timings.queue_ms() / 1000,
                         r.timings.decode_ms() / 1000);
  spdlog::info(
      "request id={} protocol={} model={} latent={} latent_dtype={} output={} format={} mode={} degree={} "
      "group={} queue_ms={:.1f} decode_ms={:.1f} gather_ms={:.1f} stream_ms={:.1f} "
      "total_ms={:.1f} collectives={} collective_wait_ms={} peak_bytes={} status={} message={}",
      rpc::LogValue(req.request_id()), protocol, req.model().empty() ? "-" : rpc::LogValue(req.model()), Shape(latent),
      v1::DType_IsValid(req.latent().dtype()) ? v1::DType_Name(req.latent().dtype()) : "?", Shape(r.output_shape),
      v1::OutputFormat_IsValid(req.output_format()) ? v1::OutputFormat_Name(req.output_format()) : "?", r.mode,
      r.degree, r.group.empty() ? "-" : r.group, r.timings.queue_ms(), r.timings.decode_ms(), r.timings.gather_ms(),
      r.timings.stream_ms(), total_ms, r.collectives, Milliseconds(r.collective_wait_ms_per_rank),
      Shape(r.peak_bytes_per_rank), rpc::StatusCodeName(status.code()), rpc::LogValue(status.message()));
}

void DecodeService::ReportEncode(const Job& job, const absl::Status& status, const std::string& protocol) {
  const JobReport r = job.report();
  const double total_ms = absl::ToDoubleMilliseconds(absl::Now() - job.received());
  const v1::EncodeRequest& req = *job.encode();
  const std::string model = job.model().name().empty() ? "_unknown" : job.model().name();
  if (job.TakePending()) metrics_.AddPending(job.model().name(), -1);
  const int64_t batch = req.image().shape_size() > 0 ? req.image().shape(0) : 1;
  metrics_.RecordRequest(model, protocol, status.code(), batch, total_ms / 1000, r.timings.queue_ms() / 1000,
                         r.timings.decode_ms() / 1000);
  const std::string image = req.has_image() ? Shape({req.image().shape().begin(), req.image().shape().end()})
                                            : absl::StrCat("encoded(", req.encoded_image().size(), "B)");
  spdlog::info(
      "request id={} protocol={} op=encode model={} image={} posterior={} space={} output={} mode={} degree={} "
      "group={} queue_ms={:.1f} encode_ms={:.1f} stream_ms={:.1f} total_ms={:.1f} collectives={} "
      "collective_wait_ms={} peak_bytes={} status={} message={}",
      rpc::LogValue(req.request_id()), protocol, req.model().empty() ? "-" : rpc::LogValue(req.model()), image,
      v1::Posterior_IsValid(req.posterior()) ? v1::Posterior_Name(req.posterior()) : "?",
      req.latent_space() == v1::LATENT_SPACE_RAW ? "raw" : "vae", Shape(r.output_shape), r.mode, r.degree,
      r.group.empty() ? "-" : r.group, r.timings.queue_ms(), r.timings.decode_ms(), r.timings.stream_ms(), total_ms,
      r.collectives, Milliseconds(r.collective_wait_ms_per_rank), Shape(r.peak_bytes_per_rank),
      rpc::StatusCodeName(status.code()), rpc::LogValue(status.message()));
}

grpc::ServerUnaryReactor* DecodeService::ListModels(grpc::CallbackServerContext* context, const v1::ListModelsRequest*,
                                                    v1::ListModelsResponse* response) {
  for (v1::ModelInfo& m : catalog_.List()) *response->add_models() = std::move(m);
  for (v1::UnavailableModel& m : catalog_.Unavailable()) *response->add_unavailable() = std::move(m);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::GetModel(grpc::CallbackServerContext* context,
                                                  const v1::GetModelRequest* request, v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::ModelInfo> found = catalog_.Lookup(request->name());
  if (found.ok()) *response = *std::move(found);
  reactor->Finish(rpc::ToGrpcStatus(found.status()));
  return reactor;
}

}  // namespace vaedecode::server
