#include "families/decoder.h"

#include <algorithm>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/input_checks.h"

namespace vaedecode::families {

absl::StatusOr<at::ScalarType> ParseDtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\" (float32, bfloat16 or float16)"));
}

std::string DtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

at::ScalarType DecodeDtype(const ModelInfo& info, at::ScalarType requested) {
  if (info.is_audio) return at::kFloat;
  return requested == at::kHalf && info.force_upcast ? at::kFloat : requested;
}

std::string DecodeDtypeReason(const ModelInfo& info, at::ScalarType requested) {
  if (DecodeDtype(info, requested) == requested) return "";
  if (info.is_audio) {
    return absl::StrCat("decoded in float32: ", info.diffusers_class,
                        " is an audio VAE, which vaedecode always runs in float32 (its latents are small; "
                        "MiniMax-H3's degrades audibly in reduced precision, so diffusers keeps it in float32)");
  }
  return absl::StrCat("decoded in float32, not float16: the VAE's config sets force_upcast (", info.diffusers_class,
                      " overflows in float16; diffusers' pipelines upcast it too)");
}

void ApplyDecodeDtype(Decoder& decoder, at::ScalarType requested) {
  const at::ScalarType dtype = DecodeDtype(decoder.info(), requested);
  if (dtype != decoder.dtype()) decoder.ToDtype(dtype);
}

absl::Status Decoder::ValidateLatent(const at::Tensor& latent) const {
  const ModelInfo& m = info();
  return CheckInputTensor(latent, {"latent", m.diffusers_class, "expects", m.latent_channels, m.is_video});
}

absl::Status Decoder::CheckExactSharding(const std::vector<int64_t>&, int) const {
  return absl::UnimplementedError(absl::StrCat(info().diffusers_class, " cannot be decoded exactly sharded"));
}

absl::Status Decoder::CheckStreaming() const {
  const ModelInfo& m = info();
  if (!m.is_video)
    return absl::FailedPreconditionError(
        absl::StrCat(m.diffusers_class, " is an image model: a session streams the frames of a video"));
  return absl::FailedPreconditionError(absl::StrCat(
      m.diffusers_class,
      " cannot be decoded chunk by chunk: its decoder carries no causal state from one latent frame to the next here"));
}

std::unique_ptr<DecodeStream> Decoder::OpenStream(const DecodeConditioning&) { return nullptr; }

int64_t Decoder::StreamedFrames(int64_t latent_frames, bool clip_ended) const {
  (void)clip_ended;
  return rpc::OutputFrames(info().output_frames, info().temporal_factor, latent_frames);
}

std::vector<int64_t> Decoder::OutputShape(const std::vector<int64_t>& latent_shape) const {
  const ModelInfo& m = info();
  std::vector<int64_t> out = latent_shape;
  out[1] = m.out_channels;
  const size_t h = out.size() - 2;
  out[h] *= m.spatial_factor;
  out[h + 1] *= m.spatial_factor;
  if (m.is_video) out[2] = rpc::OutputFrames(m.output_frames, m.temporal_factor, out[2]);
  return out;
}

int64_t FrameOutput::Add(const at::Tensor& frames) {
  const int64_t n = std::min(frames.size(2), frames_ - filled_);
  if (n <= 0) return 0;
  if (!out_.defined()) {
    if (n == frames_ && frames.size(2) == n && frames.storage().nbytes() == frames.nbytes()) {
      out_ = frames;
      filled_ = n;
      return n;
    }
    std::vector<int64_t> shape = frames.sizes().vec();
    shape[2] = frames_;
    out_ = at::empty(shape, frames.options());
  }
  out_.narrow(2, filled_, n).copy_(frames.narrow(2, 0, n));
  filled_ += n;
  return n;
}

at::Tensor FrameOutput::Take() {
  if (filled_ == 0 || full()) return std::move(out_);
  return out_.narrow(2, 0, filled_).clone(at::MemoryFormat::Contiguous);  // not a view keeping it all alive
}

void ChunkFrames::Add(at::Tensor frames) {
  ++added_;
  if (out_ && parts_.empty()) {
    const int64_t taken = out_->Add(frames);
    if (taken == frames.size(2)) return;
    frames = frames.narrow(2, taken, frames.size(2) - taken);
  }
  parts_.push_back(std::move(frames));
  if (out_ || added_ != 2 || steps_ <= 2) return;
  // Sized from the second step: the first's frames, then every other step's.
  out_.emplace(parts_[0].size(2) + (steps_ - 1) * parts_[1].size(2));
  for (const at::Tensor& part : parts_) out_->Add(part);
  parts_.clear();
}

at::Tensor ChunkFrames::Take() {
  std::vector<at::Tensor> all;
  if (out_ && out_->filled() > 0) all.push_back(out_->Take());
  for (at::Tensor& part : parts_) all.push_back(std::move(part));
  return all.size() == 1 ? all[0] : at::cat(all, 2);
}

}  // namespace vaedecode::families
