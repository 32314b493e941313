#pragma once

// The group leader's side of proto/vaedecode/internal/worker.proto, served on
// a Unix socket to the server (the frontend). Run converts the request's raw
// latent bytes to a tensor, plans the decode once (PlanDecode: the mode the
// server chose in the RunRequest, the prepared latent, the tiles), runs it
// on the group, and
// streams the output as the public API's Header / Chunks / Trailer
// (LeaderResponse). A streaming session's chunk (RunRequest.session) is
// planned the same way with its SessionStep (a replay decodes the session's
// history first), and streams the chunk's own frames.
//
// Threading: Run is a callback-API stream: each call decodes on a thread of
// its own and writes through the reactor, and the caller's cancellation
// arrives as an event (OnCancel) that raises the flag the group checks at
// every GroupNorm and tile. Models and Status are sync handlers on gRPC's
// threads. Jobs serialise inside GroupRuntime::Run.

#include <grpcpp/grpcpp.h>

#include "tiling/calibration.h"
#include "vaedecode/internal/worker.grpc.pb.h"
#include "worker/group_runtime.h"
#include "worker/model_repository.h"

namespace vaedecode::worker {

class LeaderService final : public internal::GroupLeader::WithCallbackMethod_Run<internal::GroupLeader::Service> {
 public:
  // `runtime` must outlive the service; `requested_dtype` is the dtype the
  // worker was asked to decode in (each model runs in
  // families::DecodeDtype of it); `profiles[i]` is model i's measured decode
  // peak (tiling/calibration.h); `unavailable` the repository's models that
  // did not load, which Models reports with their reasons.
  LeaderService(GroupRuntime& runtime, at::ScalarType requested_dtype, std::vector<tiling::PeakProfile> profiles,
                std::vector<UnavailableModel> unavailable = {});

  grpc::ServerWriteReactor<v1::DecodeResponse>* Run(grpc::CallbackServerContext* context,
                                                    const internal::RunRequest* run) override;
  grpc::Status Models(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                      v1::ListModelsResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const internal::StatusRequest* request,
                      internal::StatusResponse* response) override;
  grpc::Status CloseSession(grpc::ServerContext* context, const internal::CloseSessionRequest* request,
                            internal::CloseSessionResponse* response) override;

 private:
  class RunCall;
  // The decode of one Run call, on its own thread: plan, run, stream.
  grpc::Status Decode(const internal::RunRequest& run, RunCall& call);
  // A Run whose request is an encode (RunRequest.encode).
  grpc::Status Encode(const internal::RunRequest& run, RunCall& call);

  GroupRuntime& runtime_;
  const at::ScalarType requested_dtype_;
  const std::vector<tiling::PeakProfile> profiles_;
  const std::vector<UnavailableModel> unavailable_;
  // Per model: MeasureSessionStateBytesPerLatent, once at start.
  std::vector<double> session_state_bytes_per_latent_;
  absl::Mutex stats_mu_;
  std::vector<int64_t> last_peak_bytes_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace vaedecode::worker
