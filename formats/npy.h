#pragma once

// Reader and writer for NumPy's .npy format
// (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
// No torch here. Never throws; malformed input is an InvalidArgument whose
// one-line message names the file and the problem.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/safetensors.h"

namespace vaedecode::formats {

// A whole array in memory, normalized: C order, little-endian.
struct NpyArray {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // () is a 0-d array with one element.
  std::string data;            // numel * DTypeSize(dtype) bytes.
};

// Reads format versions 1.0, 2.0 and 3.0. Supported descr: f2 f4 f8, i1 i2 i4
// i8, u1 u2 u4 u8 and b1, with byte order '<', '>' (byte-swapped on read), '='
// (native, i.e. little-endian) or, for one-byte types only, '|'.
// fortran_order True is transposed to C order. Structured and object dtypes
// are rejected, and so is a file whose data is shorter or longer than the
// shape says (NumPy ignores trailing bytes; here they mean a wrong shape).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Same as ReadNpy on the bytes of a file; `label` names it in errors.
absl::StatusOr<NpyArray> ParseNpy(std::string_view bytes, std::string_view label);

// Writes a version 1.0 file (2.0 if the header would exceed 65535 bytes), C
// order, little-endian descr, header padded so the data starts at a multiple
// of 64 bytes. `data` holds nbytes == numel * DTypeSize(dtype) bytes in C
// order. BF16 has no NumPy dtype and is an error. Atomic: path + ".tmp", then
// rename.
absl::Status WriteNpy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data,
                      size_t nbytes);

}  // namespace vaedecode::formats
