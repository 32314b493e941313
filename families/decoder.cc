#include "families/decoder.h"

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

void ChunkFrames::Add(at::Tensor frames) {
  ++added_;
  const int64_t n = frames.size(2);
  if (out_.defined() && filled_ + n <= out_.size(2) && parts_.empty()) {
    out_.narrow(2, filled_, n).copy_(frames);
    filled_ += n;
    return;
  }
  parts_.push_back(std::move(frames));
  if (out_.defined() || added_ != 2 || steps_ <= 2) return;
  // Sized from the second step: the first's frames, then every other step's.
  std::vector<int64_t> shape = parts_[1].sizes().vec();
  shape[2] = parts_[0].size(2) + (steps_ - 1) * parts_[1].size(2);
  out_ = at::empty(shape, parts_[1].options());
  for (const at::Tensor& part : parts_) {
    out_.narrow(2, filled_, part.size(2)).copy_(part);
    filled_ += part.size(2);
  }
  parts_.clear();
}

at::Tensor ChunkFrames::Take() {
  if (!out_.defined()) return parts_.size() == 1 ? std::move(parts_[0]) : at::cat(parts_, 2);
  if (parts_.empty() && filled_ == out_.size(2)) return std::move(out_);
  // A later step returned another count: what was filled, copied out of the
  // larger tensor (not a view keeping it alive), then the rest.
  std::vector<at::Tensor> all = {out_.narrow(2, 0, filled_)};
  for (at::Tensor& part : parts_) all.push_back(std::move(part));
  return all.size() == 1 ? all[0].clone(at::MemoryFormat::Contiguous) : at::cat(all, 2);
}

}  // namespace vaedecode::families
