#include "formats/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace vaedecode::formats {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = Cat(QuoteForError(path), ": cannot open: ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(Cat(QuoteForError(path), ": not a regular file"));
  }
  std::string bytes;
  bytes.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(Cat(QuoteForError(path), ": read failed after ", done, " of ", bytes.size(), " bytes",
                                     n < 0 ? ": " + ErrnoText(err) : ""));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

absl::Status WriteFileAtomically(const std::string& path, const std::vector<ByteChunk>& chunks) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(Cat(QuoteForError(tmp), ": cannot create: ", ErrnoText(errno)));
  }
  bool ok = true;
  int err = 0;
  for (const ByteChunk& chunk : chunks) {
    if (chunk.size == 0) continue;
    if (std::fwrite(chunk.data, 1, chunk.size, f) != chunk.size) {
      ok = false;
      err = errno;
      break;
    }
  }
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::InternalError(Cat(QuoteForError(tmp), ": write failed: ", ErrnoText(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(Cat(QuoteForError(path), ": cannot rename from .tmp: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

std::string QuoteForError(std::string_view text) { return absl::CHexEscape(AsAbsl(text)); }

}  // namespace vaedecode::formats
