#include "rpc/latent_tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status_macros.h"

namespace vaedecode::rpc {
namespace {

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
      return absl::InvalidArgumentError(absl::StrCat("dtype has the unknown value ", static_cast<int>(dtype)));
  }
}

absl::Status CheckLatentDtype(const v1::Tensor& latent) {
  switch (latent.dtype()) {
    case v1::FLOAT32:
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return absl::OkStatus();
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("latent.dtype: unspecified; use FLOAT32, FLOAT16 or BFLOAT16");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "latent.dtype: ",
          v1::DType_IsValid(latent.dtype()) ? v1::DType_Name(latent.dtype())
                                            : absl::StrCat("unknown value ", static_cast<int>(latent.dtype())),
          " is not a floating type; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
}

absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> shape, absl::string_view field) {
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  const auto text = [&shape] { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); };
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dimension ", i, " is ", d, " in ", text(), "; every dimension must be at least 1"));
    }
    if (d > kMaxElements / numel) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", text(), " has more than 2^40 elements"));
    }
    numel *= d;
  }
  return numel;
}

absl::StatusOr<int64_t> CountLatentElements(const v1::Tensor& latent) {
  return CountElements(latent.shape(), "latent.shape");
}

absl::Status CheckLatentBytes(const v1::Tensor& latent, int64_t numel) {
  const int64_t want_bytes = numel * DTypeSize(latent.dtype()).value();
  if (static_cast<int64_t>(latent.data().size()) != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("latent.data: ", latent.data().size(), " bytes, but shape ",
                                                   ShapeString(latent.shape()), " of ", v1::DType_Name(latent.dtype()),
                                                   " needs ", want_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ValidateLatentTensor(const v1::Tensor& latent) {
  RETURN_IF_ERROR(CheckLatentDtype(latent));
  ASSIGN_OR_RETURN(int64_t numel, CountLatentElements(latent));
  RETURN_IF_ERROR(CheckLatentBytes(latent, numel));
  return numel;
}

}  // namespace vaedecode::rpc
