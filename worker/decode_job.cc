#include "worker/decode_job.h"

#include <exception>
#include <new>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "families/status_error.h"

namespace vaedecode::worker {
namespace {

// LibTorch errors carry a multi-line backtrace after the first line.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

absl::Status FromMessage(const char* what, const std::string& message) {
  const std::string line = FirstLine(message);
  if (absl::StrContains(line, "out of memory") || absl::StrContains(line, "can't allocate")) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory: ", line));
  }
  return absl::InternalError(absl::StrCat(what, " failed: ", line));
}

}  // namespace

absl::Status CatchExceptions(const char* what, const std::function<void()>& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const families::StatusError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return FromMessage(what, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return FromMessage(what, e.what());
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, " failed with an unknown exception"));
  }
}

absl::StatusOr<at::Tensor> RunDecode(families::Decoder& decoder, const DecodeJob& job,
                                     families::LayerOps& ops) {
  absl::Status valid = decoder.ValidateLatent(job.latent);
  if (!valid.ok()) return valid;
  at::Tensor sample;
  absl::Status status = CatchExceptions("decode", [&] {
    at::Tensor z = job.latent.to(decoder.device());
    if (job.latent_space == families::LatentSpace::kRaw) z = decoder.ToVaeSpace(z.to(at::kFloat));
    sample = decoder.Decode(z.to(decoder.dtype()).contiguous(), ops, job.conditioning);
  });
  if (!status.ok()) return status;
  return sample;
}

namespace {
constexpr char kInStepPayload[] = "type.vaedecode/in-step";
constexpr char kLeaderOnlyPayload[] = "type.vaedecode/leader-only";
}  // namespace

absl::Status InStep(absl::Status status) {
  if (!status.ok()) status.SetPayload(kInStepPayload, absl::Cord("1"));
  return status;
}

bool IsInStep(const absl::Status& status) { return status.GetPayload(kInStepPayload).has_value(); }

absl::Status LeaderOnly(absl::Status status) {
  if (!status.ok()) status.SetPayload(kLeaderOnlyPayload, absl::Cord("1"));
  return status;
}

bool IsLeaderOnly(const absl::Status& status) { return status.GetPayload(kLeaderOnlyPayload).has_value(); }

}  // namespace vaedecode::worker
