#pragma once

// Baseline 8-bit JPEG writing (and reading, for tests and clients) through
// libjpeg-turbo's libjpeg API. Its errors are caught with the setjmp
// protocol and returned as Status; nothing here throws or aborts.
// Thread-safe: no shared state.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace vaedecode::formats {

// Quality when a request names none: PIL's default, which diffusers'
// remote_decode endpoints use for their JPEG replies.
inline constexpr int kDefaultJpegQuality = 75;

struct JpegImage {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 gray, 3 RGB
  std::vector<uint8_t> pixels;  // HWC, row-major
};

// Encodes gray (channels 1) or RGB (3) HWC pixels at `quality` (1..100),
// 4:2:0 chroma subsampling for RGB (PIL's default).
absl::StatusOr<std::string> EncodeJpeg(int width, int height, int channels, const uint8_t* pixels, int quality);

// The width and height a JPEG's header declares (its frame header only;
// nothing is decoded).
absl::StatusOr<std::pair<int, int>> JpegSize(const std::string& bytes);

// Decodes JPEG bytes to gray or RGB pixels.
absl::StatusOr<JpegImage> DecodeJpeg(const std::string& bytes);

}  // namespace vaedecode::formats
