#pragma once

// The Open Inference Protocol (KServe v2) over gRPC, on the same port as
// vaedecode.v1: inference.GRPCInferenceService's ServerLive, ServerReady,
// ModelReady, ServerMetadata, ModelMetadata and ModelInfer, so
// tritonclient.grpc and other OIP clients decode unchanged.
//
// ModelInfer: input "latent" (FP32, FP16 or BF16; raw_input_contents, or
// fp32_contents), output "sample". Request parameters (all optional):
//   latent_space   "vae" (default) or "raw"
//   mode           "auto", "dense", "exact", "tiled"
//   output_format  "float32" (default; FP32 [B, C, (T,) H, W]), "float16"
//                  (FP16), "uint8" (UINT8 [B, (T,) H, W, C]), "png" or
//                  "jpeg" (BYTES [B·T], one file per image / frame), "mp4"
//                  (BYTES [B], one video per batch entry)
//   scaling_factor, shift_factor (double): raw latents' own de-normalisation
//   jpeg_quality   (int64) 1..100;  png_compression (int64) 0..9, zlib's level;
//   fps            (int64) 1..240, MP4's frame rate
//   decode_timestep, decode_noise_scale (double), noise_seed (int64): LTX's
//                  timestep-conditioned decode (vaedecode.v1.DecodeRequest)
// Response parameters: mode, degree, decode_ms, queue_ms, noise_seed (the
// streaming Decode's header and trailer figures).
//
// Encode: the request parameter operation "encode" (default "decode");
// input "image" (FP32, FP16 or BF16 [B, C, (T,) H, W] in [-1, 1], UINT8
// pixels [B, (T,) H, W, C], or BYTES [1]: one PNG or JPEG file), output
// "latent" (FP32); parameters posterior ("mean", "sample", "moments"), seed,
// latent_space, mode (rpc::EncodeOptions); response parameter sample_seed.
// Triton's own request parameters (priority, timeout, sequence_*) are
// accepted and ignored. The reply is one message, bounded by
// --max_message_bytes: a larger output is RESOURCE_EXHAUSTED pointing at the
// streaming vaedecode.v1.Decode. Admission, queue, limits, deadline (the
// call's), metrics (protocol "oip") and the log line are the gRPC Decode's.
//
// ModelConfig, ModelStatistics and RepositoryIndex answer from the catalog
// and the server's counters (server/oip_answers.h, shared with the HTTP/REST
// binding).
//
// Readiness mirrors the health service: ServerReady while a group is ready
// and the server is not draining, ModelReady while a ready group serves the
// model (not ready, as Triton answers, for a model or version the server
// does not have). Input or output parameters other than the HTTP binding's
// binary_data(_size), and raw and typed contents at once, are
// INVALID_ARGUMENT.
//
// Threading: gRPC's callback API; nothing blocks a callback thread.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/decode_service.h"
#include "server/model_catalog.h"
#include "server/oip_answers.h"
#include "server/oip_translation.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

class OipService final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `max_output_bytes`: what one reply may hold. Borrowed objects outlive
  // the service.
  OipService(DecodeService& decode, const OipAnswers& answers, int64_t max_output_bytes);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;

 private:
  DecodeService& decode_;
  const OipAnswers& answers_;
  const int64_t max_output_bytes_;
};

}  // namespace vaedecode::server
