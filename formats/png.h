#pragma once

// 8-bit PNG writing (and reading, for tests) through libpng. libpng errors
// are caught with its setjmp protocol and returned as Status; nothing here
// throws or aborts. Thread-safe: no shared state.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::formats {

struct PngImage {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA.
  std::vector<uint8_t> pixels;  // HWC, row-major, height * width * channels.
};

// zlib's own default level.
inline constexpr int kDefaultPngCompression = 6;

// Encodes an 8-bit gray (channels 1), RGB (3) or RGBA (4) PNG in memory,
// deflated at `compression` 0 (stored) .. 9.
absl::StatusOr<std::string> EncodePng(int width, int height, int channels, const uint8_t* pixels,
                                      int compression = kDefaultPngCompression);

// The width and height a PNG's IHDR declares (nothing is decoded).
absl::StatusOr<std::pair<int, int>> PngSize(const std::string& bytes);

// Decodes PNG bytes like ReadPng.
absl::StatusOr<PngImage> DecodePng(const std::string& bytes);

// Writes an 8-bit gray (channels 1), RGB (3) or RGBA (4) PNG from HWC
// row-major `pixels` (height * width * channels bytes). Atomic: the file is
// written to path + ".tmp" and renamed.
absl::Status WritePng(const std::string& path, int width, int height, int channels, const uint8_t* pixels);

// Reads any PNG, expanded to 8 bits per channel (palette -> RGB, tRNS ->
// alpha, 16-bit -> 8-bit).
absl::StatusOr<PngImage> ReadPng(const std::string& path);

}  // namespace vaedecode::formats
