#pragma once

// The Open Inference Protocol's answers, independent of the binding: the gRPC
// service (server/oip_service.h) and the HTTP/REST binding
// (server/oip_rest.h) both ask here, so they answer alike.
//
// Models have one version, "1"; asking for another is NOT_FOUND (not ready
// for the readiness calls).
//
// Threading: any thread. Ownership: the catalog and metrics are borrowed and
// outlive this object.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/metrics.h"
#include "server/model_catalog.h"
#include "server/oip_translation.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// What a ModelInfer call becomes: the DecodeRequest for the admission, and
// the refusal (if any) the translation found before it.
struct OipInferCall {
  InferOperation operation = InferOperation::kDecode;
  v1::DecodeRequest decode;  // operation kDecode (and the envelope of a refusal)
  v1::EncodeRequest encode;  // operation kEncode
  absl::Status refusal;
};

class OipAnswers {
 public:
  // `serving`: the server as a whole takes requests (a group ready, not draining).
  OipAnswers(const ModelCatalog& catalog, const ServerMetrics& metrics, std::function<bool()> serving);

  bool ServerReady() const { return serving_(); }
  // Not ready (never an error) for a model or version the server lacks.
  bool ModelReady(const std::string& name, const std::string& version) const;
  inference::ServerMetadataResponse ServerMetadata() const;
  absl::StatusOr<inference::ModelMetadataResponse> ModelMetadata(const std::string& name,
                                                                 const std::string& version) const;
  absl::StatusOr<inference::ModelConfigResponse> ModelConfig(const std::string& name, const std::string& version) const;
  // One model, or every model when `name` is empty.
  absl::StatusOr<inference::ModelStatisticsResponse> ModelStatistics(const std::string& name,
                                                                     const std::string& version) const;
  inference::RepositoryIndexResponse RepositoryIndex(bool ready_only) const;

  // The decode a ModelInfer request asks for. An unknown model is left to
  // the admission, which refuses it with the list of models.
  OipInferCall PrepareInfer(const inference::ModelInferRequest& request) const;

 private:
  // The model `name` at `version` ("" or "1"), or NOT_FOUND with the list.
  absl::StatusOr<v1::ModelInfo> FindModel(const std::string& name, const std::string& version) const;

  const ModelCatalog& catalog_;
  const ServerMetrics& metrics_;
  const std::function<bool()> serving_;
};

}  // namespace vaedecode::server
