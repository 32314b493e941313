#include "families/decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  return requested == at::kHalf && info.force_upcast ? at::kFloat : requested;
}

std::string DecodeDtypeReason(const ModelInfo& info, at::ScalarType requested) {
  if (DecodeDtype(info, requested) == requested) return "";
  return absl::StrCat("decoded in float32, not float16: the VAE's config sets force_upcast (", info.diffusers_class,
                      " overflows in float16; diffusers' pipelines upcast it too)");
}

void ApplyDecodeDtype(Decoder& decoder, at::ScalarType requested) {
  const at::ScalarType dtype = DecodeDtype(decoder.info(), requested);
  if (dtype != decoder.dtype()) decoder.ToDtype(dtype);
}

absl::Status Decoder::ValidateLatent(const at::Tensor& latent) const {
  const ModelInfo& m = info();
  const int64_t want_dims = m.is_video ? 5 : 4;
  const char* layout = m.is_video ? "[B, C, T, H, W]" : "[B, C, H, W]";
  if (latent.dim() != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat("latent must be ", want_dims, "-D ", layout, " for ",
                                                   m.diffusers_class, ", got shape [",
                                                   absl::StrJoin(latent.sizes(), ", "), "]"));
  }
  if (latent.size(1) != m.latent_channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent has ", latent.size(1), " channels; ", m.diffusers_class, " expects ", m.latent_channels));
  }
  for (int64_t d = 0; d < latent.dim(); ++d) {
    if (latent.size(d) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("latent has an empty dimension: shape [", absl::StrJoin(latent.sizes(), ", "), "]"));
    }
  }
  if (!latent.is_floating_point()) {
    return absl::InvalidArgumentError("latent must be a floating-point tensor");
  }
  return absl::OkStatus();
}

absl::Status Decoder::CheckExactSharding(const std::vector<int64_t>&, int) const {
  return absl::UnimplementedError(absl::StrCat(info().diffusers_class, " cannot be decoded exactly sharded"));
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

}  // namespace vaedecode::families
