#include "server/oip_service.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status.h"

namespace vaedecode::server {
namespace {

// One ModelInfer call: cancels its job when the client goes away.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  void SetJob(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
  }
  void OnCancel() override {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job = job_.lock();
    }
    if (!job) return;
    job->Cancel(job->DeadlinePassed() ? absl::DeadlineExceededError("deadline exceeded")
                                      : absl::CancelledError("cancelled by the client"));
  }
  void OnDone() override { delete this; }

 private:
  std::mutex mu_;
  std::weak_ptr<Job> job_;
};

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

OipService::OipService(DecodeService& decode, ModelCatalog& catalog, std::function<bool()> serving,
                       int64_t max_output_bytes)
    : decode_(decode), catalog_(catalog), serving_(std::move(serving)), max_output_bytes_(max_output_bytes) {}

absl::StatusOr<v1::ModelInfo> OipService::FindModel(const std::string& name, const std::string& version) const {
  absl::StatusOr<v1::ModelInfo> model = catalog_.Lookup(name);
  if (!model.ok()) return model.status();
  if (!version.empty() && version != "1") {
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" has version 1 only, not \"", version, "\""));
  }
  return model;
}

grpc::ServerUnaryReactor* OipService::ServerLive(grpc::CallbackServerContext* context,
                                                 const inference::ServerLiveRequest*,
                                                 inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerReady(grpc::CallbackServerContext* context,
                                                  const inference::ServerReadyRequest*,
                                                  inference::ServerReadyResponse* response) {
  response->set_ready(serving_());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ModelReady(grpc::CallbackServerContext* context,
                                                 const inference::ModelReadyRequest* request,
                                                 inference::ModelReadyResponse* response) {
  // Not ready, rather than an error, for a model or version this server
  // does not have: readiness loops written for Triton poll until ready.
  absl::StatusOr<v1::ModelInfo> model = FindModel(request->name(), request->version());
  response->set_ready(model.ok() && serving_() && catalog_.Serving(request->name()));
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(grpc::CallbackServerContext* context,
                                                     const inference::ServerMetadataRequest*,
                                                     inference::ServerMetadataResponse* response) {
  response->set_name("vaedecode");
  response->set_version("1");
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(grpc::CallbackServerContext* context,
                                                    const inference::ModelMetadataRequest* request,
                                                    inference::ModelMetadataResponse* response) {
  absl::StatusOr<v1::ModelInfo> model = FindModel(request->name(), request->version());
  if (model.ok()) *response = DescribeModel(*model);
  return Answer(context, model.status());
}

grpc::ServerUnaryReactor* OipService::ModelInfer(grpc::CallbackServerContext* context,
                                                 const inference::ModelInferRequest* request,
                                                 inference::ModelInferResponse* response) {
  v1::DecodeRequest decode;
  decode.set_model(request->model_name());
  decode.set_request_id(request->id());
  absl::Status refusal;
  absl::StatusOr<v1::ModelInfo> model = FindModel(request->model_name(), request->model_version());
  if (model.ok()) {
    absl::StatusOr<v1::DecodeRequest> translated = TranslateModelInfer(*request, *model);
    if (translated.ok()) {
      decode = *std::move(translated);
    } else {
      refusal = translated.status();
    }
  } else if (!request->model_version().empty() && model.status().code() == absl::StatusCode::kNotFound &&
             catalog_.Lookup(request->model_name()).ok()) {
    refusal = model.status();  // a known model at an unknown version
  }
  // An unknown model is refused by the admission itself, with the list.
  auto* reactor = new InferReactor();
  response->set_model_name(request->model_name());
  response->set_model_version("1");
  std::shared_ptr<Job> job = decode_.StartCollected(
      std::move(decode), rpc::CallDeadline(*context), "oip", max_output_bytes_, refusal,
      [reactor, response](CollectedOutput out) {
        reactor->Finish(rpc::ToGrpcStatus(FillModelInferResponse(std::move(out), response)));
      });
  reactor->SetJob(job);
  return reactor;
}

}  // namespace vaedecode::server
