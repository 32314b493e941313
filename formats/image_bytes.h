#pragma once

// PNG, JPEG or MP4 bytes as a client sends them for an encode, told apart by
// their signature: the size their header declares (for admission limits,
// before anything is decoded) and their 8-bit pixels, which must be exactly
// that size. Torch-free, so the server reads sizes without LibTorch (and
// without FFmpeg: formats/mp4_header.h); formats/image_input.h makes tensors.

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
  int64_t frames = 1;         // an MP4's; 1 for a still image
  bool video = false;         // an MP4 (a clip, even of one frame)
  std::vector<uint8_t> data;  // THWC, row-major
};

struct DeclaredImageSize {
  int width = 0;
  int height = 0;
  int64_t frames = 1;
  bool video = false;  // an MP4
};

// The size the header declares; INVALID_ARGUMENT naming what the bytes are
// not.
absl::StatusOr<DeclaredImageSize> EncodedImageSize(const std::string& bytes);

// The decoded pixels (at most kMaxDecodedImageBytes), exactly the declared
// size; INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<Pixels> DecodeEncodedImage(const std::string& bytes);

}  // namespace vaedecode::formats
