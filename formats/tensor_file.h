#pragma once

// Tensor files (.safetensors, .npy) and PNG output, as torch tensors.
// Everything returns Status and never throws: LibTorch exceptions raised
// inside are caught here and become InternalError. Thread-safe: no shared
// state.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/safetensors.h"

namespace vaedecode::formats {

// DType <-> at::ScalarType. ScalarTypes outside DType (complex, quantized,
// ...) have no DType: InvalidArgument.
absl::StatusOr<at::ScalarType> ToScalarType(DType dtype);
absl::StatusOr<DType> FromScalarType(at::ScalarType type);

// Reads a latent from `path`, chosen by extension:
//   .safetensors  the file's only tensor, else the one named `preferred_name`,
//                 else an error that lists the names;
//   .npy          the array.
// Returns an owning, contiguous CPU tensor of the file's dtype, which must be
// F32, F16, BF16 or F64 (otherwise "latent must be a floating tensor, got
// I64"). Extensions are matched case-sensitively.
absl::StatusOr<at::Tensor> ReadTensorFile(const std::string& path, std::string_view preferred_name = "latent");

// Writes `t` (any device, any layout; copied to contiguous CPU memory first)
// in its own dtype: `.safetensors` as one tensor called `name`, or `.npy`
// (`name` unused; BF16 is an error there). Callers that want float32 convert
// first. Unknown extension: InvalidArgument.
absl::Status WriteTensorFile(const std::string& path, std::string_view name, const at::Tensor& t);

// The same for several named tensors: `.safetensors` holds them all; `.npy`
// only one (INVALID_ARGUMENT otherwise).
absl::Status WriteTensorsFile(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// 8-bit pixels of a float NCHW / NCTHW sample as diffusers' image processor
// makes them: round(clamp(x/2 + 0.5, 0, 1) * 255), as [N, T, H, W, C] uint8
// (T = 1 for images). The caller checks the shape.
absl::StatusOr<at::Tensor> ToImagePixels(const at::Tensor& sample);

// Writes decoded samples as 8-bit PNGs, the way diffusers' image processor
// does: pixel = round(clamp(sample / 2 + 0.5, 0, 1) * 255), with sample / 2 +
// 0.5 computed in the sample's dtype, the rest in float32, and ties rounded
// to even (numpy's round). NaN becomes 0.
// `sample` is NCHW (images) or NCTHW (video), any floating dtype, C = 1, 3 or
// 4 (gray, RGB, RGBA). File names, with stem = `path` minus a trailing ".png":
//   one image                  `path` itself
//   N > 1 images               stem_0.png, stem_1.png, ...
//   video (any T, N = 1)       stem_f000.png, stem_f001.png, ...
//   video, N > 1               stem_0_f000.png, ..., stem_1_f000.png, ...
// Returns the paths written, in that order. On error, files already written
// stay.
absl::StatusOr<std::vector<std::string>> WritePngImages(const std::string& path, const at::Tensor& sample);

}  // namespace vaedecode::formats
