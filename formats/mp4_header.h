#pragma once

// What an MP4 (ISO base media file) declares about its first video track,
// read from its boxes alone (moov/trak/mdia: hdlr, minf/stbl: stsd, stsz):
// coded width and height and the number of frames. Torch- and FFmpeg-free,
// so the server admits an MP4 encode by its declared size before anything
// decodes it; the leader's decode must then produce exactly that
// (formats/image_bytes.h). Fragmented MP4s (samples in moof boxes, none in
// stsz) are refused.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace vaedecode::formats {

// True when `bytes` start like an MP4 (an ftyp box first).
bool LooksLikeMp4(const std::string& bytes);

struct Mp4VideoSize {
  int width = 0;
  int height = 0;
  int64_t frames = 0;
};

// The first video track's declared size; INVALID_ARGUMENT naming what is
// malformed or missing.
absl::StatusOr<Mp4VideoSize> Mp4DeclaredVideoSize(const std::string& bytes);

}  // namespace vaedecode::formats
