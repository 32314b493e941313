#include "server/oip_answers.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"
#include "server/oip_translation.h"

namespace vaedecode::server {
namespace {

void SetDuration(uint64_t count, uint64_t ns, inference::StatisticDuration* d) {
  d->set_count(count);
  d->set_ns(ns);
}

}  // namespace

OipAnswers::OipAnswers(const ModelCatalog& catalog, const ServerMetrics& metrics, std::function<bool()> serving)
    : catalog_(catalog), metrics_(metrics), serving_(std::move(serving)) {}

absl::StatusOr<v1::ModelInfo> OipAnswers::FindModel(const std::string& name, const std::string& version) const {
  ASSIGN_OR_RETURN(v1::ModelInfo model, catalog_.Lookup(name));
  if (!version.empty() && version != "1") {
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" has version 1 only, not \"", version, "\""));
  }
  return model;
}

bool OipAnswers::ModelReady(const std::string& name, const std::string& version) const {
  return FindModel(name, version).ok() && serving_() && catalog_.Serving(name);
}

inference::ServerMetadataResponse OipAnswers::ServerMetadata() const {
  inference::ServerMetadataResponse m;
  m.set_name("vaedecode");
  m.set_version("1");
  // Triton's extension names, for what is served of each.
  for (const char* e : {"binary_tensor_data", "model_configuration", "statistics", "model_repository"}) {
    m.add_extensions(e);
  }
  return m;
}

absl::StatusOr<inference::ModelMetadataResponse> OipAnswers::ModelMetadata(const std::string& name,
                                                                           const std::string& version) const {
  ASSIGN_OR_RETURN(v1::ModelInfo model, FindModel(name, version));
  return DescribeModel(model);
}

absl::StatusOr<inference::ModelConfigResponse> OipAnswers::ModelConfig(const std::string& name,
                                                                       const std::string& version) const {
  ASSIGN_OR_RETURN(v1::ModelInfo model, FindModel(name, version));
  inference::ModelConfigResponse response;
  *response.mutable_config() = DescribeConfig(model);
  return response;
}

absl::StatusOr<inference::ModelStatisticsResponse> OipAnswers::ModelStatistics(const std::string& name,
                                                                               const std::string& version) const {
  std::vector<std::string> names;
  if (name.empty()) {
    for (const v1::ModelInfo& m : catalog_.List()) names.push_back(m.name());
  } else {
    ASSIGN_OR_RETURN(v1::ModelInfo model, FindModel(name, version));
    names.push_back(name);
  }
  inference::ModelStatisticsResponse response;
  for (const std::string& n : names) {
    const ModelCounters c = metrics_.Counters(n);
    inference::ModelStatistics* s = response.add_model_stats();
    s->set_name(n);
    s->set_version("1");
    s->set_last_inference(static_cast<uint64_t>(c.last_ms));
    s->set_inference_count(c.inferences);
    s->set_execution_count(c.success);
    inference::InferStatistics* stats = s->mutable_inference_stats();
    SetDuration(c.success, c.success_ns, stats->mutable_success());
    SetDuration(c.failure, c.failure_ns, stats->mutable_fail());
    SetDuration(c.success, c.queue_ns, stats->mutable_queue());
    SetDuration(c.success, c.compute_ns, stats->mutable_compute_infer());
    // The latent's copy in and the output's encoding are part of the decode.
    SetDuration(c.success, 0, stats->mutable_compute_input());
    SetDuration(c.success, 0, stats->mutable_compute_output());
  }
  return response;
}

inference::RepositoryIndexResponse OipAnswers::RepositoryIndex(bool ready_only) const {
  inference::RepositoryIndexResponse response;
  std::map<std::string, std::string> failed;
  for (const v1::UnavailableModel& m : catalog_.Unavailable()) failed[m.name()] = m.reason();
  for (const std::string& name : catalog_.Names()) {
    const bool ready = serving_() && catalog_.Serving(name);
    if (ready_only && !ready) continue;
    auto* m = response.add_models();
    m->set_name(name);
    m->set_version("1");
    m->set_state(ready ? "READY" : "UNAVAILABLE");
    if (!ready) {
      auto it = failed.find(name);
      m->set_reason(it != failed.end() ? absl::StrCat("failed to load: ", it->second)
                                       : "no ready worker group serves it (starting, rebuilding or draining)");
    }
  }
  return response;
}

OipInferCall OipAnswers::PrepareInfer(const inference::ModelInferRequest& request) const {
  OipInferCall call;
  call.decode.set_model(request.model_name());
  call.decode.set_request_id(request.id());
  absl::StatusOr<InferOperation> operation = OperationOf(request);
  if (!operation.ok()) {
    call.refusal = operation.status();
    return call;
  }
  call.operation = *operation;
  call.encode.set_model(request.model_name());
  call.encode.set_request_id(request.id());
  absl::StatusOr<v1::ModelInfo> model = FindModel(request.model_name(), request.model_version());
  if (model.ok()) {
    absl::Status translated;
    if (call.operation == InferOperation::kEncode) {
      absl::StatusOr<v1::EncodeRequest> encode = TranslateModelInferEncode(request, *model);
      translated = encode.status();
      if (encode.ok()) call.encode = *std::move(encode);
    } else {
      absl::StatusOr<v1::DecodeRequest> decode = TranslateModelInfer(request, *model);
      translated = decode.status();
      if (decode.ok()) call.decode = *std::move(decode);
    }
    call.refusal = translated;
  } else if (!request.model_version().empty() && model.status().code() == absl::StatusCode::kNotFound &&
             catalog_.Lookup(request.model_name()).ok()) {
    call.refusal = model.status();  // a known model at an unknown version
  }
  return call;
}

}  // namespace vaedecode::server
