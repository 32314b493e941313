#include "worker/session_streams.h"

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

absl::StatusOr<families::DecodeStream*> SessionStreams::Step(const SessionStep& step, int64_t model_index,
                                                             families::Decoder& decoder) {
  absl::MutexLock lock(&mu_);
  if (step.start) {
    RETURN_IF_ERROR(decoder.CheckStreaming());
    std::unique_ptr<families::DecodeStream> stream = decoder.OpenStream();
    if (stream == nullptr) {
      return absl::InternalError(absl::StrCat(decoder.info().diffusers_class, " says it streams but opened no stream"));
    }
    Held& held = held_[step.id];
    held = Held{model_index, std::move(stream), 0, 0};
    return held.stream.get();
  }
  auto it = held_.find(step.id);
  if (it == held_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", step.id, "'s state is not held here (its group was rebuilt or a chunk failed)"));
  }
  if (it->second.model_index != model_index) {
    return absl::InvalidArgumentError(absl::StrCat("session ", step.id, " decodes another model"));
  }
  return it->second.stream.get();
}

void SessionStreams::Finish(int64_t id, bool ok) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return;
  if (!ok) {
    held_.erase(it);
    return;
  }
  it->second.latent_frames = it->second.stream->latent_frames();
  it->second.state_bytes = it->second.stream->state_bytes();
}

void SessionStreams::Drop(int64_t id) {
  absl::MutexLock lock(&mu_);
  held_.erase(id);
}

std::optional<int64_t> SessionStreams::LatentFrames(int64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return std::nullopt;
  return it->second.latent_frames;
}

int64_t SessionStreams::StateBytes(int64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  return it == held_.end() ? 0 : it->second.state_bytes;
}

int64_t SessionStreams::TotalBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, held] : held_) total += held.state_bytes;
  return total;
}

int64_t SessionStreams::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

}  // namespace vaedecode::worker
