#include "formats/image_bytes.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/file_io.h"
#include "formats/jpeg.h"
#include "formats/mp4.h"
#include "formats/mp4_header.h"
#include "formats/png.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

bool IsPng(const std::string& bytes) { return absl::StartsWith(bytes, "\x89PNG\r\n\x1a\n"); }
bool IsJpeg(const std::string& bytes) { return absl::StartsWith(bytes, "\xff\xd8\xff"); }

absl::Status NeitherError(const std::string& bytes) {
  return absl::InvalidArgumentError(
      absl::StrCat("the image is neither PNG, JPEG nor MP4 (", bytes.size(), " bytes without their signatures)"));
}

// The declared size of an MP4 whose frames fit kMaxDecodedImageBytes.
absl::StatusOr<DeclaredImageSize> Mp4Size(const std::string& bytes) {
  ASSIGN_OR_RETURN(Mp4VideoSize size, Mp4DeclaredVideoSize(bytes));
  const uint64_t frame_bytes = uint64_t{static_cast<uint32_t>(size.width)} * static_cast<uint32_t>(size.height) * 3;
  if (static_cast<uint64_t>(size.frames) > kMaxDecodedImageBytes / frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the MP4 declares ", size.frames, " frames of ", size.width, "x",
                                                   size.height, ": more than ", kMaxDecodedImageBytes >> 20,
                                                   " MiB of pixels"));
  }
  return DeclaredImageSize{size.width, size.height, size.frames, true};
}

}  // namespace

absl::StatusOr<DeclaredImageSize> EncodedImageSize(const std::string& bytes) {
  if (IsPng(bytes) || IsJpeg(bytes)) {
    ASSIGN_OR_RETURN(const auto size, IsPng(bytes) ? PngSize(bytes) : JpegSize(bytes));
    return DeclaredImageSize{size.first, size.second};
  }
  if (LooksLikeMp4(bytes)) return Mp4Size(bytes);
  return NeitherError(bytes);
}

absl::StatusOr<Pixels> DecodeEncodedImage(const std::string& bytes) {
  if (IsPng(bytes)) {
    ASSIGN_OR_RETURN(PngImage png, DecodePng(bytes));
    return Pixels{png.width, png.height, png.channels, 1, false, std::move(png.pixels)};
  }
  if (IsJpeg(bytes)) {
    ASSIGN_OR_RETURN(JpegImage jpeg, DecodeJpeg(bytes));
    return Pixels{jpeg.width, jpeg.height, jpeg.channels, 1, false, std::move(jpeg.pixels)};
  }
  if (LooksLikeMp4(bytes)) {
    ASSIGN_OR_RETURN(const DeclaredImageSize declared, Mp4Size(bytes));
    // No more than it declared (what the server admitted it by).
    const size_t declared_bytes =
        static_cast<size_t>(declared.frames) * static_cast<size_t>(declared.width) * declared.height * 3;
    // The decoder's frames are coded in blocks (H.264 16, HEVC up to 64
    // pixels a side): it may hold that much more than the visible frame.
    const auto coded = [](int64_t side) { return (side + 63) / 64 * 64; };
    ASSIGN_OR_RETURN(DecodedVideo video,
                     DecodeMp4(bytes, declared_bytes, coded(declared.width) * coded(declared.height)));
    if (video.width != declared.width || video.height != declared.height ||
        static_cast<int64_t>(video.frames.size()) != declared.frames) {
      return absl::InvalidArgumentError(absl::StrCat("the MP4 declares ", declared.frames, " frames of ",
                                                     declared.width, "x", declared.height, " but decodes to ",
                                                     video.frames.size(), " of ", video.width, "x", video.height));
    }
    Pixels pixels{video.width, video.height, 3, declared.frames, true, {}};
    pixels.data.reserve(static_cast<size_t>(declared.frames) * video.frames.front().size());
    for (const std::vector<uint8_t>& frame : video.frames)
      pixels.data.insert(pixels.data.end(), frame.begin(), frame.end());
    return pixels;
  }
  return NeitherError(bytes);
}

}  // namespace vaedecode::formats
