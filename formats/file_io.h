#pragma once

// Whole-file reads and atomic writes shared by the format readers/writers.
// Thread-safe: no shared state.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace vaedecode::formats {

// The most bytes a decoded image (PNG or JPEG) may take: 256 MiB, a
// 9,000 x 9,000 RGB image, beyond what an encode admits; a header claiming
// more is refused before its pixels are allocated (a few bytes of JPEG
// header may claim 65535 x 65535).
inline constexpr size_t kMaxDecodedImageBytes = size_t{1} << 28;

// Reads the whole regular file at `path`. Errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// One contiguous piece of the output; `data` may be null when `size` is 0.
struct ByteChunk {
  const void* data;
  size_t size;
};

// Writes the concatenation of `chunks` to `path` + ".tmp", then renames it over
// `path`, so readers never see a half-written file. On failure the temporary
// file is removed and `path` is left as it was.
absl::Status WriteFileAtomically(const std::string& path, const std::vector<ByteChunk>& chunks);

// `text` quoted for a one-line error message: non-printable bytes, quotes and
// backslashes are escaped, so names read from files cannot break the line.
std::string QuoteForError(std::string_view text);

// Debian's Abseil has its own absl::string_view class rather than an alias of
// std::string_view, and no conversion between the two: this bridges the
// std::string_view used in this package's API to absl::StrCat and friends.
inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

namespace internal {
template <typename T>
const T& CatArg(const T& value) {
  return value;
}
inline absl::string_view CatArg(std::string_view s) { return AsAbsl(s); }
}  // namespace internal

// absl::StrCat that also accepts std::string_view arguments.
template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(internal::CatArg(args)...);
}

}  // namespace vaedecode::formats
