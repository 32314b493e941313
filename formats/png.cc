#include "formats/png.h"

#include <png.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "formats/file_io.h"

namespace vaedecode::formats {
namespace {

// libpng reports errors by calling OnError, which must not return. It
// longjmps back to the setjmp in WriteRows/ReadRows. Those functions hold
// only trivially destructible locals, so the jump skips no destructors (a
// longjmp over a non-trivial destructor is undefined behaviour); C++ objects
// live in the callers.
struct PngErrorState {
  std::jmp_buf jump;
  char message[256];
};

[[noreturn]] void OnError(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  std::longjmp(state->jump, 1);
}

void OnWarning(png_structp, png_const_charp) {}

// Appends libpng's output to the std::string behind the io pointer.
void AppendToString(png_structp png, png_bytep data, png_size_t length) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), length);
}

void NoFlush(png_structp) {}

// Returns false with state->message set on failure.
bool WriteRows(std::string* out, int width, int height, int channels, const uint8_t* pixels, int compression,
               PngErrorState* state) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, state, OnError, OnWarning);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof(state->message), "png_create_write_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    std::snprintf(state->message, sizeof(state->message), "png_create_info_struct failed");
    return false;
  }
  // `png` and `info` are not modified after setjmp, so they need no volatile.
  if (setjmp(state->jump)) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  const int color_type = channels == 1   ? PNG_COLOR_TYPE_GRAY
                         : channels == 3 ? PNG_COLOR_TYPE_RGB
                                         : PNG_COLOR_TYPE_RGB_ALPHA;
  png_set_write_fn(png, out, AppendToString, NoFlush);
  png_set_compression_level(png, compression);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, color_type,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t stride = static_cast<size_t>(width) * static_cast<size_t>(channels);
  for (int y = 0; y < height; ++y) {
    png_write_row(png, pixels + static_cast<size_t>(y) * stride);
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

// Largest decoded image ReadPng accepts, to bound memory on hostile input.
constexpr size_t kMaxReadBytes = kMaxDecodedImageBytes;

struct ReadResult {
  uint8_t* pixels;  // malloc'ed; the caller frees.
  int width;
  int height;
  int channels;
};

bool ReadRows(std::FILE* file, ReadResult* result, PngErrorState* state) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, OnError, OnWarning);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof(state->message), "png_create_read_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(state->message, sizeof(state->message), "png_create_info_struct failed");
    return false;
  }
  // Written after setjmp and read after a longjmp: must be volatile.
  uint8_t* volatile buffer = nullptr;
  if (setjmp(state->jump)) {
    std::free(buffer);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_init_io(png, file);
  png_read_info(png, info);
  png_set_expand(png);
  png_set_strip_16(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int channels = png_get_channels(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  if (rowbytes != static_cast<size_t>(width) * static_cast<size_t>(channels) ||
      (height != 0 && rowbytes > kMaxReadBytes / height)) {
    png_error(png, "unsupported or too large image layout");
  }
  buffer = static_cast<uint8_t*>(std::malloc(rowbytes * height + 1));
  if (buffer == nullptr) png_error(png, "out of memory");
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) {
      png_read_row(png, buffer + static_cast<size_t>(y) * rowbytes, nullptr);
    }
  }
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  result->pixels = buffer;
  result->width = static_cast<int>(width);
  result->height = static_cast<int>(height);
  result->channels = channels;
  return true;
}

}  // namespace

absl::StatusOr<std::string> EncodePng(int width, int height, int channels, const uint8_t* pixels, int compression) {
  if (width <= 0 || height <= 0 || width > 0x7fffffff / 4) {
    return absl::InvalidArgumentError(Cat("invalid PNG size ", width, "x", height));
  }
  if (channels != 1 && channels != 3 && channels != 4) {
    return absl::InvalidArgumentError(Cat("PNG needs 1, 3 or 4 channels, got ", channels));
  }
  if (pixels == nullptr) return absl::InvalidArgumentError("pixels is null");
  if (compression < 0 || compression > 9) {
    return absl::InvalidArgumentError(Cat("PNG compression must be 0..9, got ", compression));
  }
  std::string out;
  PngErrorState state;
  state.message[0] = '\0';
  if (!WriteRows(&out, width, height, channels, pixels, compression, &state)) {
    return absl::InternalError(Cat("encoding PNG failed: ", QuoteForError(state.message)));
  }
  return out;
}

absl::Status WritePng(const std::string& path, int width, int height, int channels, const uint8_t* pixels) {
  absl::StatusOr<std::string> bytes = EncodePng(width, height, channels, pixels);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(), Cat(QuoteForError(path), ": ", bytes.status().message()));
  }
  return WriteFileAtomically(path, {{bytes->data(), bytes->size()}});
}

namespace {

absl::StatusOr<PngImage> ReadPngFrom(std::FILE* file, const std::string& label) {
  unsigned char signature[8];
  if (std::fread(signature, 1, sizeof(signature), file) != sizeof(signature) ||
      png_sig_cmp(signature, 0, sizeof(signature)) != 0) {
    std::fclose(file);
    return absl::InvalidArgumentError(Cat(label, ": not a PNG file"));
  }
  std::rewind(file);
  PngErrorState state;
  state.message[0] = '\0';
  ReadResult result{};
  const bool ok = ReadRows(file, &result, &state);
  std::fclose(file);
  if (!ok) {
    return absl::InvalidArgumentError(Cat(label, ": bad PNG: ", QuoteForError(state.message)));
  }
  PngImage image;
  image.width = result.width;
  image.height = result.height;
  image.channels = result.channels;
  const size_t size = static_cast<size_t>(result.width) * result.height * result.channels;
  image.pixels.assign(result.pixels, result.pixels + size);
  std::free(result.pixels);
  return image;
}

}  // namespace

absl::StatusOr<PngImage> DecodePng(const std::string& bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("empty PNG data");
  std::FILE* file = fmemopen(const_cast<char*>(bytes.data()), bytes.size(), "rb");
  if (file == nullptr) return absl::InternalError("fmemopen failed");
  return ReadPngFrom(file, "PNG data");
}

absl::StatusOr<PngImage> ReadPng(const std::string& path) {
  const std::string label = QuoteForError(path);
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int err = errno;
    const std::string message = Cat(label, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  return ReadPngFrom(file, label);
}

absl::StatusOr<std::pair<int, int>> PngSize(const std::string& bytes) {
  // The signature, then the IHDR chunk first: length (13), "IHDR", width, height (big-endian).
  if (bytes.size() < 24 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || bytes.compare(12, 4, "IHDR") != 0) {
    return absl::InvalidArgumentError("not a PNG (no signature and IHDR chunk)");
  }
  const auto be32 = [&](size_t at) {
    return (uint32_t{static_cast<uint8_t>(bytes[at])} << 24) | (uint32_t{static_cast<uint8_t>(bytes[at + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(bytes[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(bytes[at + 3])};
  };
  const uint32_t width = be32(16), height = be32(20);
  if (width == 0 || height == 0 || width > 0x7fffffff || height > 0x7fffffff) {
    return absl::InvalidArgumentError(Cat("bad PNG: its header declares ", width, "x", height, " pixels"));
  }
  return std::make_pair(static_cast<int>(width), static_cast<int>(height));
}

}  // namespace vaedecode::formats
