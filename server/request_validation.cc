#include "server/request_validation.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::server {
namespace {

constexpr size_t kMaxRequestIdLength = 128;

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<int64_t> DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    case v1::UINT8:
      return 1;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("dtype is unspecified");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype has the unknown value ", static_cast<int>(dtype)));
  }
}

absl::Status ValidateDecodeRequest(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  if (request.request_id().size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", request.request_id().size(),
                                                   " characters; at most ", kMaxRequestIdLength));
  }
  if (!v1::LatentSpace_IsValid(request.latent_space())) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent_space: unknown value ", static_cast<int>(request.latent_space())));
  }
  if (!v1::Mode_IsValid(request.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: unknown value ", static_cast<int>(request.mode())));
  }
  if (!v1::OutputFormat_IsValid(request.output_format())) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_format: unknown value ", static_cast<int>(request.output_format())));
  }
  if (!request.has_latent()) return absl::InvalidArgumentError("latent: missing");
  const v1::Tensor& latent = request.latent();
  switch (latent.dtype()) {
    case v1::FLOAT32:
    case v1::FLOAT16:
    case v1::BFLOAT16:
      break;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "latent.dtype: unspecified; use FLOAT32, FLOAT16 or BFLOAT16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("latent.dtype: ",
                       v1::DType_IsValid(latent.dtype())
                           ? v1::DType_Name(latent.dtype())
                           : absl::StrCat("unknown value ", static_cast<int>(latent.dtype())),
                       " is not a floating type; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  const int want_rank = model.is_video() ? 5 : 4;
  if (latent.shape_size() != want_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.shape: model \"", model.name(), "\" takes ",
        model.is_video() ? "[B, C, T, H, W]" : "[B, C, H, W]", " latents (rank ", want_rank,
        "), got rank ", latent.shape_size(), " ", ShapeString(latent.shape())));
  }
  // Bounded so that numel × element size cannot overflow int64.
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  int64_t numel = 1;
  for (int i = 0; i < latent.shape_size(); ++i) {
    const int64_t d = latent.shape(i);
    if (d < 1) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: dimension ", i, " is ", d,
                                                     " in ", ShapeString(latent.shape()),
                                                     "; every dimension must be at least 1"));
    }
    if (d > kMaxElements / numel) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: ", ShapeString(latent.shape()),
                                                     " has more than 2^40 elements"));
    }
    numel *= d;
  }
  const bool raw = request.latent_space() == v1::LATENT_SPACE_RAW;
  const int64_t channels =
      raw && model.raw_latent_channels() > 0 ? model.raw_latent_channels() : model.latent_channels();
  if (channels > 0 && latent.shape(1) != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.shape: model \"", model.name(), "\" takes ", channels, raw ? " raw" : "",
        " latent channels, got ", latent.shape(1), " in ", ShapeString(latent.shape()),
        !raw && latent.shape(1) == model.raw_latent_channels() ? " (a packed raw latent: send latent_space RAW)"
                                                                : ""));
  }
  const int64_t want_bytes = numel * DTypeSize(latent.dtype()).value();
  if (static_cast<int64_t>(latent.data().size()) != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.data: ", latent.data().size(), " bytes, but shape ", ShapeString(latent.shape()),
        " of ", v1::DType_Name(latent.dtype()), " needs ", want_bytes));
  }
  if (request.output_format() == v1::OUTPUT_UINT8 || request.output_format() == v1::OUTPUT_PNG) {
    const int64_t c = model.out_channels();
    if (c != 0 && c != 1 && c != 3 && c != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("output_format: ", v1::OutputFormat_Name(request.output_format()),
                       " needs 1, 3 or 4 output channels; model \"", model.name(), "\" has ", c));
    }
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::server
