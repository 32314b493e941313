#include "formats/image_bytes.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/jpeg.h"
#include "formats/png.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

bool IsPng(const std::string& bytes) { return absl::StartsWith(bytes, "\x89PNG\r\n\x1a\n"); }
bool IsJpeg(const std::string& bytes) { return absl::StartsWith(bytes, "\xff\xd8\xff"); }

absl::Status NeitherError(const std::string& bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("the image is neither PNG nor JPEG (", bytes.size(), " bytes without either's signature)"));
}

}  // namespace

absl::StatusOr<std::pair<int, int>> EncodedImageSize(const std::string& bytes) {
  if (IsPng(bytes)) return PngSize(bytes);
  if (IsJpeg(bytes)) return JpegSize(bytes);
  return NeitherError(bytes);
}

absl::StatusOr<Pixels> DecodeEncodedImage(const std::string& bytes) {
  if (IsPng(bytes)) {
    ASSIGN_OR_RETURN(PngImage png, DecodePng(bytes));
    return Pixels{png.width, png.height, png.channels, std::move(png.pixels)};
  }
  if (IsJpeg(bytes)) {
    ASSIGN_OR_RETURN(JpegImage jpeg, DecodeJpeg(bytes));
    return Pixels{jpeg.width, jpeg.height, jpeg.channels, std::move(jpeg.pixels)};
  }
  return NeitherError(bytes);
}

}  // namespace vaedecode::formats
