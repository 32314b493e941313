#pragma once

// The group leader's side of proto/vaedecode/internal/worker.proto, served on
// a Unix socket to the server (the frontend). Run converts the request's raw
// latent bytes to a tensor, plans the decode once (PlanDecode: the mode the
// server chose, the prepared latent, the tiles), runs it on the group, and
// streams the output as the public API's Header / Chunks / Trailer
// (LeaderResponse).
//
// Threading: gRPC's sync server calls handlers on its own threads; jobs
// serialise inside GroupRuntime::Run.

#include <grpcpp/grpcpp.h>

#include "vaedecode/internal/worker.grpc.pb.h"
#include "tiling/calibration.h"
#include "worker/group_runtime.h"

namespace vaedecode::worker {

class LeaderService final : public internal::GroupLeader::Service {
 public:
  // `runtime` must outlive the service; `requested_dtype` is the dtype the
  // worker was asked to decode in (each model runs in
  // families::DecodeDtype of it); `profiles[i]` is model i's measured decode
  // peak (tiling/calibration.h).
  LeaderService(GroupRuntime& runtime, at::ScalarType requested_dtype, std::vector<tiling::PeakProfile> profiles);

  grpc::Status Run(grpc::ServerContext* context, const v1::DecodeRequest* request,
                   grpc::ServerWriter<v1::DecodeResponse>* writer) override;
  grpc::Status Models(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                      v1::ListModelsResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const internal::StatusRequest* request,
                      internal::StatusResponse* response) override;

 private:
  GroupRuntime& runtime_;
  const at::ScalarType requested_dtype_;
  const std::vector<tiling::PeakProfile> profiles_;
  absl::Mutex stats_mu_;
  std::vector<int64_t> last_peak_bytes_ ABSL_GUARDED_BY(stats_mu_);
};

// The latent of a request as a CPU tensor, or INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<at::Tensor> LatentFromRequest(const v1::Tensor& latent);

}  // namespace vaedecode::worker
