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

OipService::OipService(DecodeService& decode, const OipAnswers& answers, int64_t max_output_bytes)
    : decode_(decode), answers_(answers), max_output_bytes_(max_output_bytes) {}

grpc::ServerUnaryReactor* OipService::ServerLive(grpc::CallbackServerContext* context,
                                                 const inference::ServerLiveRequest*,
                                                 inference::ServerLiveResponse* response) {
  response->set_live(true);
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerReady(grpc::CallbackServerContext* context,
                                                  const inference::ServerReadyRequest*,
                                                  inference::ServerReadyResponse* response) {
  response->set_ready(answers_.ServerReady());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ModelReady(grpc::CallbackServerContext* context,
                                                 const inference::ModelReadyRequest* request,
                                                 inference::ModelReadyResponse* response) {
  response->set_ready(answers_.ModelReady(request->name(), request->version()));
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(grpc::CallbackServerContext* context,
                                                     const inference::ServerMetadataRequest*,
                                                     inference::ServerMetadataResponse* response) {
  *response = answers_.ServerMetadata();
  return Answer(context, absl::OkStatus());
}

// Fills `response` from `answer`, or answers its error.
template <typename Response>
grpc::ServerUnaryReactor* AnswerWith(grpc::CallbackServerContext* context, absl::StatusOr<Response> answer,
                                     Response* response) {
  if (answer.ok()) *response = *std::move(answer);
  return Answer(context, answer.status());
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(grpc::CallbackServerContext* context,
                                                    const inference::ModelMetadataRequest* request,
                                                    inference::ModelMetadataResponse* response) {
  return AnswerWith(context, answers_.ModelMetadata(request->name(), request->version()), response);
}

grpc::ServerUnaryReactor* OipService::ModelConfig(grpc::CallbackServerContext* context,
                                                  const inference::ModelConfigRequest* request,
                                                  inference::ModelConfigResponse* response) {
  return AnswerWith(context, answers_.ModelConfig(request->name(), request->version()), response);
}

grpc::ServerUnaryReactor* OipService::ModelStatistics(grpc::CallbackServerContext* context,
                                                      const inference::ModelStatisticsRequest* request,
                                                      inference::ModelStatisticsResponse* response) {
  return AnswerWith(context, answers_.ModelStatistics(request->name(), request->version()), response);
}

grpc::ServerUnaryReactor* OipService::RepositoryIndex(grpc::CallbackServerContext* context,
                                                      const inference::RepositoryIndexRequest* request,
                                                      inference::RepositoryIndexResponse* response) {
  *response = answers_.RepositoryIndex(request->ready());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OipService::ModelInfer(grpc::CallbackServerContext* context,
                                                 const inference::ModelInferRequest* request,
                                                 inference::ModelInferResponse* response) {
  OipInferCall call = answers_.PrepareInfer(*request);
  auto* reactor = new InferReactor();
  response->set_model_name(request->model_name());
  response->set_model_version("1");
  const InferOperation operation = call.operation;
  auto done = [reactor, response, operation](CollectedOutput out) {
    reactor->Finish(rpc::ToGrpcStatus(FillModelInferResponse(std::move(out), response, operation)));
  };
  const absl::Time deadline = rpc::CallDeadline(*context);
  std::shared_ptr<Job> job = operation == InferOperation::kEncode
                                 ? decode_.StartCollectedEncode(std::move(call.encode), absl::Now(), deadline, "oip",
                                                                max_output_bytes_, call.refusal, std::move(done))
                                 : decode_.StartCollected(std::move(call.decode), deadline, "oip", max_output_bytes_,
                                                          call.refusal, std::move(done));
  reactor->SetJob(job);
  return reactor;
}

}  // namespace vaedecode::server
