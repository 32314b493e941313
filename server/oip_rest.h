#pragma once

// The Open Inference Protocol's HTTP/REST binding (KServe v2, with Triton's
// binary tensor extension) as pure translations between its JSON and the
// protocol's messages, so the HTTP endpoint answers REST calls with the very
// code that answers gRPC ones (server/oip_answers.h, oip_translation.h).
//
// Infer request: a JSON object {"id", "parameters", "inputs": [{"name",
// "shape", "datatype", "parameters", "data"}], "outputs": [{"name",
// "parameters"}]}, alone or followed by binary tensors: the header
// Inference-Header-Content-Length gives the JSON's length, and each input
// whose parameters hold "binary_data_size": N takes the next N bytes, in
// input order. JSON "data" (flat or nested lists) is accepted for FP32.
// Outputs go back as binary data when the request parameter
// "binary_data_output" or the output's "binary_data" is true (tritonclient's
// default), else as JSON "data" (FP32 and UINT8 only: FP16 and BYTES have no
// JSON form).
//
// Thread-safe: pure functions. Never throws (the JSON library is used
// without exceptions; the fuzzer holds it to that).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/http_reply.h"

namespace vaedecode::server {

struct RestInferRequest {
  inference::ModelInferRequest request;
  bool binary_output = false;  // answer with Triton's binary tensor extension
};

// The request for model `name` at `version` from a POST body;
// `header_length` is Inference-Header-Content-Length (-1 when absent).
// INVALID_ARGUMENT naming the field at fault.
absl::StatusOr<RestInferRequest> ParseRestInferRequest(const std::string& body, int64_t header_length,
                                                       const std::string& name, const std::string& version);

// The reply to a successful infer, in the form the request asked for.
// INVALID_ARGUMENT when a JSON reply cannot hold the output's datatype.
absl::StatusOr<HttpReply> BuildRestInferReply(const inference::ModelInferResponse& response, bool binary_output);

// The JSON of the other answers, as Triton's HTTP binding writes them.
std::string ServerMetadataJson(const inference::ServerMetadataResponse& metadata);
std::string ModelMetadataJson(const inference::ModelMetadataResponse& metadata);
std::string ModelConfigJson(const inference::ModelConfig& config);
std::string ModelStatisticsJson(const inference::ModelStatisticsResponse& statistics);
std::string RepositoryIndexJson(const inference::RepositoryIndexResponse& index);

// POST /v2/repository/index's body ({"ready": bool}, or empty): whether
// only ready models are asked for.
absl::StatusOr<bool> ParseRepositoryIndexRequest(const std::string& body);

}  // namespace vaedecode::server
