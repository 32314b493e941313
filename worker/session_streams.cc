#include "worker/session_streams.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "families/layer_ops.h"
#include "families/status_error.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

namespace {

// A chunk's latent shape without its frame count.
std::vector<int64_t> ChunkShape(const at::Tensor& latent) {
  std::vector<int64_t> shape = latent.sizes().vec();
  if (shape.size() > 2) shape[2] = 0;
  return shape;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d == 0 ? "T" : absl::StrCat(d));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

}  // namespace

double MeasureSessionStateBytesPerLatent(families::Decoder& decoder) {
  if (!decoder.CheckStreaming().ok()) return 0;
  constexpr int64_t kSide = 4;
  int64_t most = 0;
  const absl::Status measured = families::CatchExceptions("session state measure", [&] {
    std::unique_ptr<families::DecodeStream> stream = decoder.OpenStream();
    if (stream == nullptr) return;
    families::DenseOps ops;
    const at::Tensor z = at::zeros({1, decoder.info().latent_channels, 1, kSide, kSide},
                                   at::TensorOptions().dtype(decoder.dtype()).device(decoder.device()));
    // A latent frame at a time, past the output frame table where it has
    // one: a window stream (MiniMax-H3) holds the most once a window was
    // decoded and the next one's latents are coming.
    const int64_t chunks = std::max<int64_t>(3, static_cast<int64_t>(decoder.info().output_frames.frames.size()));
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      (void)stream->DecodeChunk(z, ops);
      most = std::max(most, stream->state_bytes());
    }
  });
  return measured.ok() ? static_cast<double>(most) / (kSide * kSide) : 0;
}

absl::Status SessionStreams::Check(const DecodePlan& plan, int64_t model_index) const {
  const SessionStep& step = plan.session;
  if (step.start) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = held_.find(step.id);
  if (it == held_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", step.id, "'s state is not held by this group (rebuilt, or a chunk failed): replay its history"));
  }
  const Held& held = it->second;
  if (held.model_index != model_index) {
    return absl::InvalidArgumentError(absl::StrCat("session ", step.id, " decodes another model"));
  }
  if (held.mode != plan.mode) {
    return absl::InvalidArgumentError(absl::StrCat("session ", step.id, " decodes ", ModeName(held.mode),
                                                   "; this chunk was planned ", ModeName(plan.mode)));
  }
  if (held.chunk_shape != ChunkShape(plan.latent) || held.dtype != plan.latent.scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", step.id, "'s chunks are ", ShapeText(held.chunk_shape), " ", c10::toString(held.dtype),
        "; this one is ", ShapeText(ChunkShape(plan.latent)), " ", c10::toString(plan.latent.scalar_type())));
  }
  return absl::OkStatus();
}

absl::StatusOr<families::DecodeStream*> SessionStreams::Step(const DecodePlan& plan, int64_t model_index,
                                                             families::Decoder& decoder) {
  RETURN_IF_ERROR(Check(plan, model_index));
  absl::MutexLock lock(&mu_);
  const SessionStep& step = plan.session;
  if (step.start) {
    RETURN_IF_ERROR(decoder.CheckStreaming());
    std::unique_ptr<families::DecodeStream> stream = decoder.OpenStream(plan.conditioning);
    if (stream == nullptr) {
      return absl::InternalError(absl::StrCat(decoder.info().diffusers_class, " says it streams but opened no stream"));
    }
    Held& held = held_[step.id];
    held = Held{model_index, plan.mode, ChunkShape(plan.latent), plan.latent.scalar_type(), std::move(stream), 0, 0};
    return held.stream.get();
  }
  return held_.at(step.id).stream.get();
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
