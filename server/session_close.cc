#include "server/session_close.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace vaedecode::server {
namespace {

// A session close job's stream: it writes nothing.
class NoOutputStream final : public JobStream {
 public:
  void StartWrite(const v1::DecodeResponse*) override {}
  void Finish(const absl::Status&) override {}
  void Abort() override {}
};

}  // namespace

std::shared_ptr<Job> MakeSessionCloseJob(const std::shared_ptr<SessionRecord>& session, const v1::ModelInfo& model,
                                         std::shared_ptr<SessionRegistry> registry) {
  static auto* const no_output = new NoOutputStream;  // never destroyed: a close job may finish at exit
  v1::DecodeRequest request;
  request.set_model(model.name());
  request.set_request_id(absl::StrCat(session->public_id(), "/close"));
  auto job = std::make_shared<Job>(std::move(request), model, absl::Now(), absl::InfiniteFuture(), JobBuffering{});
  job->SetSession(session, Job::SessionPart::kClose);
  job->Attach(no_output, [registry = std::move(registry), session](const Job&, const absl::Status&) {
    registry->Close(*session);
  });
  return job;
}

}  // namespace vaedecode::server
