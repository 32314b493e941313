#include "server/session_record.h"

#include "absl/strings/str_cat.h"

namespace vaedecode::server {

SessionRecord::SessionRecord(int64_t id, std::string public_id, std::string group, v1::Mode mode,
                             int64_t state_bytes_per_rank, int64_t max_history_bytes)
    : id_(id),
      public_id_(std::move(public_id)),
      group_(std::move(group)),
      mode_(mode),
      state_bytes_per_rank_(state_bytes_per_rank),
      max_history_bytes_(max_history_bytes) {}

absl::StatusOr<internal::SessionStep> SessionRecord::StepOn(const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  internal::SessionStep step;
  step.set_id(id_);
  step.set_latent_frames_done(latent_frames_done_);
  last_replayed_ = 0;
  if (!holder_.empty() && holder_ == incarnation) return step;
  step.set_start(true);
  if (latent_frames_done_ == 0) return step;
  if (!history_complete_) {
    return absl::UnavailableError(
        absl::StrCat("session ", public_id_, "'s group lost its decoder state and its history (", latent_frames_done_,
                     " latent frames) is past --session_history_mib, so it cannot be replayed; open a new session"));
  }
  *step.mutable_replay() = ConcatFrames(history_);
  last_replayed_ = latent_frames_done_;
  return step;
}

void SessionRecord::ChunkDone(const std::string& incarnation, const v1::Tensor& latent) {
  absl::MutexLock lock(&mu_);
  holder_ = incarnation;
  latent_frames_done_ += latent.shape_size() == 5 ? latent.shape(2) : 0;
  if (!history_complete_) return;
  history_bytes_ += static_cast<int64_t>(latent.data().size());
  if (history_bytes_ > max_history_bytes_) {
    history_complete_ = false;  // a replay would need all of it
    history_.clear();
    history_.shrink_to_fit();
    return;
  }
  history_.push_back(latent);
}

void SessionRecord::StateLost() {
  absl::MutexLock lock(&mu_);
  holder_.clear();
}

int64_t SessionRecord::latent_frames_done() const {
  absl::MutexLock lock(&mu_);
  return latent_frames_done_;
}

int64_t SessionRecord::last_replayed() const {
  absl::MutexLock lock(&mu_);
  return last_replayed_;
}

int64_t SessionRecord::history_bytes() const {
  absl::MutexLock lock(&mu_);
  return history_complete_ ? history_bytes_ : 0;
}

v1::Tensor ConcatFrames(const std::vector<v1::Tensor>& chunks) {
  v1::Tensor joined;
  if (chunks.empty()) return joined;
  const v1::Tensor& first = chunks.front();
  joined.set_dtype(first.dtype());
  *joined.mutable_shape() = first.shape();
  int64_t frames = 0;
  size_t bytes = 0;
  for (const v1::Tensor& c : chunks) {
    frames += c.shape(2);
    bytes += c.data().size();
  }
  joined.set_shape(2, frames);
  // C order: each (batch, channel) holds its frames contiguously, so the
  // chunks' blocks interleave per (batch, channel).
  const int64_t blocks = first.shape(0) * first.shape(1);
  std::string* data = joined.mutable_data();
  data->reserve(bytes);
  for (int64_t b = 0; b < blocks; ++b) {
    for (const v1::Tensor& c : chunks) {
      const size_t block = c.data().size() / static_cast<size_t>(blocks);
      data->append(c.data(), static_cast<size_t>(b) * block, block);
    }
  }
  return joined;
}

}  // namespace vaedecode::server
