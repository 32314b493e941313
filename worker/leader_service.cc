#include "worker/leader_service.h"

#include <atomic>
#include <thread>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "device/compute_device.h"
#include "rpc/leader_call.h"
#include "rpc/status.h"
#include "worker/decode_plan.h"
#include "worker/leader_response.h"
#include "worker/proto_conversion.h"

namespace vaedecode::worker {

LeaderService::LeaderService(GroupRuntime& runtime, at::ScalarType requested_dtype,
                             std::vector<tiling::PeakProfile> profiles, std::vector<UnavailableModel> unavailable)
    : runtime_(runtime),
      requested_dtype_(requested_dtype),
      profiles_(std::move(profiles)),
      unavailable_(std::move(unavailable)) {}

grpc::Status LeaderService::Models(grpc::ServerContext*, const v1::ListModelsRequest*,
                                   v1::ListModelsResponse* response) {
  for (size_t i = 0; i < runtime_.models().size(); ++i) {
    DescribeModel(runtime_.models()[i], profiles_[i], runtime_.world_size(), response->add_models());
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

// One Run call: the reactor the stream is written through, and the thread
// its decode runs on (the callback API's reactions must not block).
class LeaderService::RunCall final : public grpc::ServerWriteReactor<v1::DecodeResponse>, public ResponseSink {
 public:
  RunCall(LeaderService& service, const internal::RunRequest* run)
      : thread_([this, &service, run] {
          // No exception may end the process: whatever escapes the decode's
          // own handling (an allocation while streaming, say) is a status.
          grpc::Status status;
          const absl::Status caught = CatchExceptions("leader call", [&] { status = service.Decode(*run, *this); });
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
  absl::StatusOr<DecodePlan> plan = PlanDecode(decoder, JobFromRequest(request, *std::move(latent)), planning);
  if (!plan.ok()) return rpc::ToGrpcStatus(plan.status());
  job.plan = *std::move(plan);

  LeaderResponse response(call, request, run.max_chunk_bytes() > 0 ? run.max_chunk_bytes() : rpc::kDefaultMaxChunkBytes,
                          decoder.OutputShape(job.plan.latent.sizes().vec()),
                          families::DecodeDtypeReason(decoder.info(), requested_dtype_));
  absl::StatusOr<DecodeOutcome> outcome = runtime_.Run(job, call.cancel_flag(), response.Progress(job.plan));
  if (!outcome.ok()) return rpc::ToGrpcStatus(outcome.status());
  {
    absl::MutexLock lock(&stats_mu_);
    last_peak_bytes_.clear();
    for (const RankStats& r : outcome->ranks) last_peak_bytes_.push_back(r.peak_bytes);
  }
  return rpc::ToGrpcStatus(response.Finish(job.plan, *outcome, runtime_.world_size()));
}

}  // namespace vaedecode::worker
