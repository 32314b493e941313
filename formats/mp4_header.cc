#include "formats/mp4_header.h"

#include <functional>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace vaedecode::formats {
namespace {

uint32_t ReadU32(std::string_view s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) | (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(s[at + 3])};
}

uint16_t ReadU16(std::string_view s, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(s[at]) << 8) | static_cast<uint8_t>(s[at + 1]));
}

// Calls `visit(type, body)` for each box of `data` in order, until it
// returns false; false when a box's size does not fit what holds it.
bool ForEachBox(std::string_view data, const std::function<bool(std::string_view, std::string_view)>& visit) {
  size_t at = 0;
  while (at < data.size()) {
    if (data.size() - at < 8) return false;
    uint64_t size = ReadU32(data, at);
    size_t header = 8;
    if (size == 1) {  // a 64-bit size follows the type
      if (data.size() - at < 16) return false;
      size = (uint64_t{ReadU32(data, at + 8)} << 32) | ReadU32(data, at + 12);
      header = 16;
    } else if (size == 0) {  // to the end of what holds it
      size = data.size() - at;
    }
    if (size < header || size > data.size() - at) return false;
    if (!visit(data.substr(at + 4, 4), data.substr(at + header, size - header))) return true;
    at += size;
  }
  return true;
}

// The body of the first box of `type` in `data`, if any (nullopt also for
// malformed sizes: the caller reports the box as missing).
std::optional<std::string_view> Child(std::string_view data, std::string_view type) {
  std::optional<std::string_view> found;
  const bool well_formed = ForEachBox(data, [&](std::string_view t, std::string_view body) {
    if (t != type) return true;
    found = body;
    return false;
  });
  return well_formed ? found : std::nullopt;
}

// A track's declared video size, or why it is not a readable video track
// (nullopt: not a video track at all).
std::optional<absl::StatusOr<Mp4VideoSize>> VideoTrack(std::string_view trak) {
  const std::optional<std::string_view> mdia = Child(trak, "mdia");
  if (!mdia) return std::nullopt;
  const std::optional<std::string_view> hdlr = Child(*mdia, "hdlr");
  // hdlr: version/flags (4), pre_defined (4), handler_type (4).
  if (!hdlr || hdlr->size() < 12 || hdlr->substr(8, 4) != "vide") return std::nullopt;
  const std::optional<std::string_view> minf = Child(*mdia, "minf");
  const std::optional<std::string_view> stbl = minf ? Child(*minf, "stbl") : std::nullopt;
  const std::optional<std::string_view> stsd = stbl ? Child(*stbl, "stsd") : std::nullopt;
  const std::optional<std::string_view> stsz = stbl ? Child(*stbl, "stsz") : std::nullopt;
  if (!stsd || !stsz) return absl::InvalidArgumentError("the MP4's video track has no sample table (stsd, stsz)");
  // stsd: version/flags (4), entry_count (4), then the first sample entry
  // box: size (4), format (4), reserved (6), data_reference_index (2),
  // pre_defined/reserved (16), width (2), height (2).
  if (stsd->size() < 8 + 8 + 28 || ReadU32(*stsd, 4) < 1) {
    return absl::InvalidArgumentError("the MP4's video track has no visual sample entry");
  }
  Mp4VideoSize size;
  size.width = ReadU16(*stsd, 8 + 8 + 24);
  size.height = ReadU16(*stsd, 8 + 8 + 26);
  // stsz: version/flags (4), sample_size (4), sample_count (4).
  if (stsz->size() < 12) return absl::InvalidArgumentError("the MP4's sample size box (stsz) is truncated");
  size.frames = ReadU32(*stsz, 8);
  if (size.frames == 0) {
    return absl::InvalidArgumentError(
        "the MP4's video track lists no frames (a fragmented MP4 keeps them in moof boxes: remux it with "
        "`ffmpeg -i in.mp4 -c copy -movflags +faststart out.mp4`)");
  }
  if (size.width < 1 || size.height < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the MP4 declares ", size.width, "x", size.height, " frames"));
  }
  return size;
}

}  // namespace

bool LooksLikeMp4(const std::string& bytes) { return bytes.size() >= 8 && bytes.compare(4, 4, "ftyp") == 0; }

absl::StatusOr<Mp4VideoSize> Mp4DeclaredVideoSize(const std::string& bytes) {
  if (!LooksLikeMp4(bytes)) return absl::InvalidArgumentError("not an MP4 (no ftyp box first)");
  const std::optional<std::string_view> moov = Child(bytes, "moov");
  if (!moov) return absl::InvalidArgumentError("the MP4 has no readable movie box (moov)");
  std::optional<absl::StatusOr<Mp4VideoSize>> video;
  const bool well_formed = ForEachBox(*moov, [&](std::string_view type, std::string_view body) {
    if (type != "trak") return true;
    video = VideoTrack(body);
    return !video.has_value();  // stop at the first video track
  });
  if (!well_formed) return absl::InvalidArgumentError("the MP4's movie box (moov) is malformed");
  if (!video) return absl::InvalidArgumentError("the MP4 has no video track");
  return *std::move(video);
}

}  // namespace vaedecode::formats
