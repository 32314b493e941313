// DecodeService::StartCollected / StartCollectedEncode / DecodeCollected: one
// decode or encode whose output is gathered in the server, for the unary
// protocols (HTTP remote_decode and remote_encode, OIP ModelInfer).

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "rpc/output_assembler.h"
#include "server/decode_service.h"

namespace vaedecode::server {
namespace {

// The refusal of an output larger than one unary reply may hold: at
// admission from the predicted size (`bytes`), or while collecting (-1:
// not known).
absl::Status OutputTooLarge(int64_t max_output_bytes, int64_t bytes) {
  const auto mib = [](int64_t b) { return absl::StrFormat("%.1f MiB", static_cast<double>(b) / (1 << 20)); };
  return absl::ResourceExhaustedError(
      absl::StrCat("the output is ", bytes >= 0 ? mib(bytes) : std::string("more than that"), ", more than the ",
                   mib(max_output_bytes), " one unary reply may hold; decode it with vaedecode.v1.Decode (streaming)"));
}

// The Job's client stream, completed at once: each message goes straight
// into the assembler (the only copy the server makes of the output) and the
// write is done before StartWrite returns, so the group is never held by
// the caller. Finish hands the output to `done`.
class CollectingStream final : public JobStream {
 public:
  // `job` owns this stream (through its done callback), so it outlives it.
  CollectingStream(Job* job, int64_t max_output_bytes, std::function<void(CollectedOutput)> done)
      : job_(job), max_output_bytes_(max_output_bytes), done_(std::move(done)) {}

  void StartWrite(const v1::DecodeResponse* message) override {
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      bytes_ += static_cast<int64_t>(message->ByteSizeLong());
      if (bytes_ > max_output_bytes_) {
        failure = OutputTooLarge(max_output_bytes_, -1);
      } else {
        failure = assembler_.Add(*message);
        if (!failure.ok()) failure = absl::InternalError(absl::StrCat("the group's stream: ", failure.message()));
      }
    }
    // Outside our lock: both calls may come back into Finish.
    if (!failure.ok()) job_->Cancel(std::move(failure));
    job_->OnWriteDone(true);
  }

  void Finish(const absl::Status& status) override {
    CollectedOutput out;
    {
      absl::MutexLock lock(&mu_);
      out.status = status.ok() ? assembler_.Finish() : status;
      out.request_id = job_->request_id();
      if (out.status.ok()) {
        out.header = assembler_.header();
        out.trailer = assembler_.trailer();
        out.tensor = assembler_.TakeTensorBytes();
        out.images = assembler_.TakeImages();
      }
    }
    done_(std::move(out));
  }

  void Abort() override {}  // nothing is ever left in flight

 private:
  Job* const job_;
  const int64_t max_output_bytes_;
  const std::function<void(CollectedOutput)> done_;
  absl::Mutex mu_;
  rpc::OutputAssembler assembler_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::shared_ptr<Job> DecodeService::StartCollected(v1::DecodeRequest request, absl::Time deadline, std::string protocol,
                                                   int64_t max_output_bytes, absl::Status refusal,
                                                   std::function<void(CollectedOutput)> done) {
  active_.fetch_add(1);
  Admission admission = Admit(std::move(request), absl::Now(), deadline, std::move(protocol));
  if (!refusal.ok()) admission.status = std::move(refusal);  // the caller's reason comes first
  if (admission.status.ok()) {
    // A tensor output's size is known now: refused before any decode.
    const int64_t predicted = PredictTensorOutputBytes(admission.job->request(), admission.job->model());
    if (predicted > max_output_bytes) {
      metrics_.RecordRejected("output_too_large");
      admission.status = OutputTooLarge(max_output_bytes, predicted);
    }
  }
  return StartCollecting(admission, max_output_bytes, std::move(done));
}

std::shared_ptr<Job> DecodeService::StartCollectedEncode(v1::EncodeRequest request, absl::Time received,
                                                         absl::Time deadline, std::string protocol,
                                                         int64_t max_output_bytes, absl::Status refusal,
                                                         std::function<void(CollectedOutput)> done) {
  active_.fetch_add(1);
  // A latent is a fraction of its image: the collecting stream's bound suffices.
  const Admission admission = AdmitEncode(std::move(request), received, deadline, std::move(protocol), refusal);
  return StartCollecting(admission, max_output_bytes, std::move(done));
}

std::shared_ptr<Job> DecodeService::StartCollecting(const Admission& admission, int64_t max_output_bytes,
                                                    std::function<void(CollectedOutput)> done) {
  auto stream = std::make_shared<CollectingStream>(admission.job.get(), max_output_bytes,
                                                   [this, done = std::move(done)](CollectedOutput out) {
                                                     done(std::move(out));
                                                     active_.fetch_sub(1);
                                                   });
  // The Job keeps the stream alive until it is destroyed itself.
  Start(admission, stream.get(), stream);
  return admission.job;
}

CollectedOutput DecodeService::DecodeCollected(v1::DecodeRequest request, absl::Time deadline, std::string protocol,
                                               int64_t max_output_bytes, absl::Status refusal) {
  // Shared: Notify may still be returning when the wait below ends.
  auto finished = std::make_shared<absl::Notification>();
  auto out = std::make_shared<CollectedOutput>();
  StartCollected(std::move(request), deadline, std::move(protocol), max_output_bytes, std::move(refusal),
                 [finished, out](CollectedOutput o) {
                   *out = std::move(o);
                   finished->Notify();
                 });
  finished->WaitForNotification();
  return std::move(*out);
}

}  // namespace vaedecode::server
