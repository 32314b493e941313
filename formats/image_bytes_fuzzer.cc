// libFuzzer entry point for the image bytes an Encode request may carry
// (EncodeRequest.encoded_image, formats/image_bytes.h: PNG, JPEG, MP4): the
// size read from the header (what the server admits by) and the decoded
// pixels, which must agree with it; anything malformed is a one-line Status.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "formats/image_bytes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const auto one_line = [](const absl::Status& s) {
    if (s.ok() || s.message().find('\n') != std::string::npos) std::abort();
  };
  auto declared = vaedecode::formats::EncodedImageSize(bytes);
  auto pixels = vaedecode::formats::DecodeEncodedImage(bytes);
  if (!declared.ok()) one_line(declared.status());
  if (!pixels.ok()) {
    one_line(pixels.status());
    return 0;
  }
  const vaedecode::formats::Pixels& p = *pixels;
  if (p.width < 1 || p.height < 1 || p.channels < 1 || p.channels > 4 || p.frames < 1) std::abort();
  if (p.data.size() != static_cast<size_t>(p.frames) * p.width * p.height * p.channels) std::abort();
  // What the server admitted by is what was decoded.
  if (!declared.ok() || declared->width != p.width || declared->height != p.height || declared->frames != p.frames ||
      declared->video != p.video) {
    std::abort();
  }
  return 0;
}
