#include "worker/leader_service.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "device/compute_device.h"
#include "families/status_error.h"
#include "rpc/leader_call.h"
#include "rpc/request_checks.h"
#include "rpc/status.h"
#include "worker/decode_plan.h"
#include "worker/encode_job.h"
#include "worker/group_encode.h"
#include "worker/leader_response.h"
#include "worker/output_stream.h"
#include "worker/proto_conversion.h"

namespace vaedecode::worker {

LeaderService::LeaderService(GroupRuntime& runtime, at::ScalarType requested_dtype,
                             std::vector<tiling::PeakProfile> profiles, std::vector<UnavailableModel> unavailable)
    : runtime_(runtime),
      requested_dtype_(requested_dtype),
      profiles_(std::move(profiles)),
      unavailable_(std::move(unavailable)) {
  device::UseComputeDevice(runtime_.device());
  for (const NamedModel& m : runtime_.models()) {
    session_state_bytes_per_latent_.push_back(MeasureSessionStateBytesPerLatent(*m.decoder));
  }
}

grpc::Status LeaderService::Models(grpc::ServerContext*, const v1::ListModelsRequest*,
                                   v1::ListModelsResponse* response) {
  for (size_t i = 0; i < runtime_.models().size(); ++i) {
    DescribeModel(runtime_.models()[i], profiles_[i], runtime_.world_size(), response->add_models(),
                  session_state_bytes_per_latent_[i]);
  }
  for (const UnavailableModel& m : unavailable_) {
    v1::UnavailableModel* u = response->add_unavailable();
    u->set_name(m.name);
    u->set_reason(m.reason);
  }
  return grpc::Status::OK;
}

grpc::Status LeaderService::Status(grpc::ServerContext*, const internal::StatusRequest* request,
                                   internal::StatusResponse* response) {
  response->set_idle(runtime_.WaitIdle(absl::Milliseconds(std::max<int64_t>(0, request->wait_idle_ms()))));
  response->set_world_size(runtime_.world_size());
  response->set_decodes(runtime_.decodes());
  for (int64_t b : runtime_.free_bytes_per_rank()) response->add_free_bytes_per_rank(b);
  for (int64_t b : runtime_.capacity_bytes_per_rank()) response->add_capacity_bytes_per_rank(b);
  absl::MutexLock lock(&stats_mu_);
  for (int64_t b : last_peak_bytes_) response->add_peak_bytes_per_rank(b);
  return grpc::Status::OK;
}

grpc::Status LeaderService::CloseSession(grpc::ServerContext*, const internal::CloseSessionRequest* request,
                                         internal::CloseSessionResponse*) {
  const GroupRuntime::Call busy(runtime_);
  return rpc::ToGrpcStatus(runtime_.CloseSession(request->id()));
}

// One Run call: the reactor the stream is written through, and the thread
// its decode runs on (the callback API's reactions must not block).
class LeaderService::RunCall final : public grpc::ServerWriteReactor<v1::DecodeResponse>, public ResponseSink {
 public:
  RunCall(LeaderService& service, const internal::RunRequest* run)
      : thread_([this, &service, run] {
          // No exception may end the process: whatever escapes the decode's
          // own handling (an allocation while streaming, say) is a status.
          grpc::Status status;
          const absl::Status caught = CatchExceptions("leader call", [&] {
            status = run->has_encode() ? service.Encode(*run, *this) : service.Decode(*run, *this);
          });
          Finish(caught.ok() ? status : rpc::ToGrpcStatus(caught));
        }) {}

  bool Write(const v1::DecodeResponse& message) override {
    if (cancelled_.load()) return false;
    {
      absl::MutexLock lock(&mu_);
      write_done_ = false;
    }
    StartWrite(&message);  // outside the lock: OnWriteDone may run on any thread
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&write_done_));
    return write_ok_;
  }
  bool cancelled() const override { return cancelled_.load(); }
  const std::atomic<bool>* cancel_flag() const { return &cancelled_; }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_ok_ = ok;
    write_done_ = true;
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    // Finish was the thread's last step; it may still be returning from it.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  absl::Mutex mu_;
  bool write_done_ ABSL_GUARDED_BY(mu_) = true;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  std::atomic<bool> cancelled_{false};
  std::thread thread_;  // last: it starts once the rest is built
};

grpc::ServerWriteReactor<v1::DecodeResponse>* LeaderService::Run(grpc::CallbackServerContext*,
                                                                 const internal::RunRequest* run) {
  return new RunCall(*this, run);
}

grpc::Status LeaderService::Decode(const internal::RunRequest& run, RunCall& call) {
  const v1::DecodeRequest& request = run.request();
  const GroupRuntime::Call busy(runtime_);      // for the server's wait-for-idle after a cancel
  device::UseComputeDevice(runtime_.device());  // a thread of its own: make the worker's GPU current
  const int model = runtime_.FindModel(request.model());
  if (model < 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown model \"", request.model(), "\""));
  }
  absl::StatusOr<at::Tensor> latent = LatentFromRequest(request.latent());
  if (!latent.ok()) return rpc::ToGrpcStatus(latent.status());
  families::Decoder& decoder = *runtime_.models()[model].decoder;
  const internal::SessionStep& step = run.session();
  if (run.has_session() && step.has_replay()) {
    // The state is rebuilt from the session's history, decoded first.
    absl::StatusOr<at::Tensor> history = LatentFromRequest(step.replay());
    if (!history.ok()) return rpc::ToGrpcStatus(history.status());
    if (history->dim() != latent->dim() || history->dim() != 5 || history->scalar_type() != latent->scalar_type()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a session's replay is not a latent like its chunk");
    }
    if (history->size(2) != step.latent_frames_done()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("a session's replay holds ", history->size(2), " latent frames of ", step.latent_frames_done()));
    }
    latent = at::cat({*history, *latent}, 2);
  }

  // The plan, once, here: every rank and every tile gets the same prepared latent.
  PlanningContext planning;
  // The scheduler's choice, else the request's own; AUTO shards when it can.
  planning.requested = PlannedMode(run.mode() != v1::MODE_AUTO ? run.mode() : request.mode());
  planning.world_size = runtime_.world_size();
  planning.profile = &profiles_[model];
  planning.free_bytes_per_rank = runtime_.free_bytes_per_rank();
  if (const device::DeviceMemory* memory = device::ProcessDeviceMemory();
      planning.free_bytes_per_rank.empty() && memory != nullptr) {
    planning.free_bytes_per_rank = {memory->free_bytes()};
  }
  GroupJob job;
  job.model_index = model;
  DecodeJob decode_job = JobFromRequest(request, *std::move(latent));
  decode_job.session_chunk = run.has_session();
  absl::StatusOr<DecodePlan> plan = PlanDecode(decoder, decode_job, planning);
  if (!plan.ok()) return rpc::ToGrpcStatus(plan.status());
  job.plan = *std::move(plan);
  // An audio track to mux: its waveform, on the leader alone, once the video is planned.
  at::Tensor audio;
  int64_t audio_rate = 0;
  if (rpc::HasMuxedAudio(request)) {
    const int audio_model = runtime_.FindModel(request.audio_model());
    if (audio_model < 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("audio_model: unknown model \"", request.audio_model(), "\""));
    }
    const families::ModelInfo& info = runtime_.models()[audio_model].decoder->info();
    if (!info.is_audio || info.sample_rate == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("audio_model: \"", request.audio_model(), "\" decodes no waveform"));
    }
    const v1::DecodeRequest audio_request = rpc::MuxedAudioRequest(request);
    absl::StatusOr<at::Tensor> audio_latent = LatentFromRequest(audio_request.latent());
    if (!audio_latent.ok()) return rpc::ToGrpcStatus(audio_latent.status());
    absl::StatusOr<at::Tensor> waveform = runtime_.DecodeOnLeader(
        audio_model, JobFromRequest(audio_request, *std::move(audio_latent)), call.cancel_flag());
    if (!waveform.ok()) {
      return rpc::ToGrpcStatus(
          absl::Status(waveform.status().code(), absl::StrCat("audio: ", waveform.status().message())));
    }
    absl::StatusOr<at::Tensor> track = MuxableAudio(*waveform, request.latent().shape(0));
    if (!track.ok()) return rpc::ToGrpcStatus(track.status());
    audio = *std::move(track);
    audio_rate = info.sample_rate;
  }
  std::vector<int64_t> out_shape = decoder.OutputShapeFor(job.plan.latent.sizes().vec(), job.plan.conditioning);
  if (run.has_session()) {
    const int64_t replayed = step.has_replay() ? step.replay().shape(2) : 0;
    job.plan.session = {step.id(), step.start(), step.ends(), replayed};
    // The chunk's own frames: what the session's stream returns for them.
    const int64_t done = step.latent_frames_done();
    const int64_t after = done + job.plan.latent.size(2) - replayed;
    out_shape[2] = decoder.StreamedFrames(after, step.ends()) - decoder.StreamedFrames(done, false);
  }

  LeaderResponse response(call, request, run.max_chunk_bytes() > 0 ? run.max_chunk_bytes() : rpc::kDefaultMaxChunkBytes,
                          out_shape, families::DecodeDtypeReason(decoder.info(), requested_dtype_),
                          decoder.info().pixels, decoder.info().sample_rate);
  if (audio.defined()) response.MuxAudio(audio, audio_rate);
  absl::StatusOr<DecodeOutcome> outcome = runtime_.Run(job, call.cancel_flag(), response.Progress(job.plan));
  if (!outcome.ok()) return rpc::ToGrpcStatus(outcome.status());
  {
    absl::MutexLock lock(&stats_mu_);
    last_peak_bytes_.clear();
    for (const RankStats& r : outcome->ranks) last_peak_bytes_.push_back(r.peak_bytes);
  }
  return rpc::ToGrpcStatus(response.Finish(job.plan, *outcome, runtime_.world_size()));
}

grpc::Status LeaderService::Encode(const internal::RunRequest& run, RunCall& call) {
  const v1::EncodeRequest& request = run.encode();
  const GroupRuntime::Call busy(runtime_);
  device::UseComputeDevice(runtime_.device());
  const int model = runtime_.FindModel(request.model());
  if (model < 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown model \"", request.model(), "\""));
  }
  // A large clip's float conversion can fail to allocate: a status, not a throw.
  absl::StatusOr<at::Tensor> image = absl::InternalError("no image");
  if (absl::Status s = families::CatchExceptions("image", [&] { image = ImageFromRequest(request); }); !s.ok()) {
    return rpc::ToGrpcStatus(s);
  }
  if (!image.ok()) return rpc::ToGrpcStatus(image.status());
  absl::StatusOr<families::Encoder*> encoder = runtime_.Encoder(model);
  if (!encoder.ok()) return rpc::ToGrpcStatus(encoder.status());
  const EncodeJob job = EncodeJobFromRequest(request, *std::move(image));
  absl::StatusOr<at::Tensor> prepared = PrepareImage(**encoder, job);
  if (!prepared.ok()) return rpc::ToGrpcStatus(prepared.status());
  const v1::Mode mode = run.mode() != v1::MODE_AUTO ? run.mode() : request.mode();
  GroupJob group_job;
  group_job.kind = JobKind::kEncode;
  group_job.model_index = model;
  group_job.encode = PlanEncode(**encoder, *prepared, mode == v1::MODE_DENSE ? DecodeMode::kDense : DecodeMode::kExact,
                                runtime_.world_size());
  // Where some rank has a memory bound, the plan must fit it (measured once per model).
  const std::vector<int64_t> reported = runtime_.free_bytes_per_rank();
  if (std::any_of(reported.begin(), reported.end(), [](int64_t f) { return f >= 0; })) {
    absl::StatusOr<GroupRuntime::EncodeRoom> room = runtime_.EncodeRoomFor(model);
    if (!room.ok()) return rpc::ToGrpcStatus(room.status());
    if (absl::Status fits =
            CheckEncodeFits(**encoder, room->peak, group_job.encode, room->free_bytes_per_rank, runtime_.world_size());
        !fits.ok()) {
      return rpc::ToGrpcStatus(fits);
    }
  }
  absl::StatusOr<EncodeOutcome> outcome = runtime_.RunEncode(group_job, call.cancel_flag());
  if (!outcome.ok()) return rpc::ToGrpcStatus(outcome.status());
  absl::StatusOr<EncodeResult> result = FinishEncode(**encoder, outcome->moments, job);
  if (!result.ok()) return rpc::ToGrpcStatus(result.status());
  {
    absl::MutexLock lock(&stats_mu_);
    last_peak_bytes_.clear();
    for (const RankStats& r : outcome->ranks) last_peak_bytes_.push_back(r.peak_bytes);
  }
  // The latent (moments: mean and log-variance on channels) as a float32 output.
  const at::Tensor latent = result->latent.defined() ? result->latent : at::cat({result->mean, result->logvar}, 1);
  v1::DecodeResponse header_message;
  v1::Header* header = header_message.mutable_header();
  header->set_request_id(run.request().request_id());
  if (absl::Status s = DescribeOutput(latent, v1::OUTPUT_FLOAT32, header); !s.ok()) return rpc::ToGrpcStatus(s);
  header->set_mode(outcome->mode == DecodeMode::kExact ? v1::MODE_EXACT : v1::MODE_DENSE);
  header->set_degree(outcome->mode == DecodeMode::kExact ? runtime_.world_size() : 1);
  header->set_mode_reason(group_job.encode.reason);
  if (result->seed) header->set_sample_seed(*result->seed);
  if (!call.Write(header_message)) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  const int64_t max_chunk = run.max_chunk_bytes() > 0 ? run.max_chunk_bytes() : rpc::kDefaultMaxChunkBytes;
  const absl::Status streamed = EmitChunks(latent, OutputEncoding{}, max_chunk, [&](v1::Chunk&& chunk) {
    v1::DecodeResponse message;
    *message.mutable_chunk() = std::move(chunk);
    return call.Write(message);
  });
  if (!streamed.ok()) return rpc::ToGrpcStatus(streamed);
  v1::DecodeResponse trailer_message;
  v1::Trailer* trailer = trailer_message.mutable_trailer();
  trailer->mutable_timings()->set_decode_ms(outcome->encode_ms);
  for (const RankStats& r : outcome->ranks) {
    trailer->add_peak_bytes_per_rank(r.peak_bytes);
    trailer->add_collective_wait_ms_per_rank(r.comm_ms);
  }
  trailer->set_collectives(outcome->comm.collectives());
  if (!call.Write(trailer_message)) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  return grpc::Status::OK;
}

}  // namespace vaedecode::worker
