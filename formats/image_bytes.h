#pragma once

// PNG or JPEG bytes as a client sends them for an encode, told apart by
// their signature: the size their header declares (for admission limits,
// before anything is decoded) and their 8-bit pixels. Torch-free, so the
// server reads sizes without LibTorch; formats/image_input.h makes tensors.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace vaedecode::formats {

struct Pixels {
  int width = 0;
  int height = 0;
  int channels = 0;           // 1 gray, 2 gray + alpha (PNG), 3 RGB, 4 RGBA (PNG)
  std::vector<uint8_t> data;  // HWC, row-major
};

// Width and height from the header alone; INVALID_ARGUMENT naming what the
// bytes are not.
absl::StatusOr<std::pair<int, int>> EncodedImageSize(const std::string& bytes);

// The decoded pixels (at most kMaxDecodedImageBytes); INVALID_ARGUMENT
// naming what is wrong.
absl::StatusOr<Pixels> DecodeEncodedImage(const std::string& bytes);

}  // namespace vaedecode::formats
