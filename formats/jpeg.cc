#include "formats/jpeg.h"

#include <cstdio>
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include <csetjmp>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "formats/file_io.h"

namespace vaedecode::formats {
namespace {

// libjpeg reports errors through error_exit, which must not return: it
// longjmps back to the setjmp in CompressRows/DecompressRows, which hold only
// trivially destructible locals (C++ objects live in the callers).
struct JpegErrorState {
  jpeg_error_mgr manager;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void OnError(j_common_ptr info) {
  auto* state = reinterpret_cast<JpegErrorState*>(info->err);
  (*info->err->format_message)(info, state->message);
  std::longjmp(state->jump, 1);
}

void OnMessage(j_common_ptr, int) {}  // warnings and traces: not printed

void InitErrors(JpegErrorState* state) {
  jpeg_std_error(&state->manager);
  state->manager.error_exit = OnError;
  state->manager.emit_message = OnMessage;
  state->message[0] = '\0';
}

// On success *out/*size hold a malloc'd buffer the caller frees.
bool CompressRows(int width, int height, int channels, const uint8_t* pixels, int quality, unsigned char** out,
                  unsigned long* size, JpegErrorState* state) {
  jpeg_compress_struct info;
  info.err = &state->manager;
  if (setjmp(state->jump)) {
    jpeg_destroy_compress(&info);
    return false;
  }
  jpeg_create_compress(&info);
  jpeg_mem_dest(&info, out, size);
  info.image_width = static_cast<JDIMENSION>(width);
  info.image_height = static_cast<JDIMENSION>(height);
  info.input_components = channels;
  info.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  const size_t stride = static_cast<size_t>(width) * static_cast<size_t>(channels);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels + info.next_scanline * stride);
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  return true;
}

struct DecodedRows {
  int width, height, channels;
  uint8_t* pixels;  // malloc'd; the caller frees
};

// `header_only`: the frame header's width and height, nothing decoded.
bool DecompressRows(const std::string& bytes, DecodedRows* result, JpegErrorState* state, bool header_only = false) {
  jpeg_decompress_struct info;
  info.err = &state->manager;
  result->pixels = nullptr;
  if (setjmp(state->jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (header_only) {
    result->width = static_cast<int>(info.image_width);
    result->height = static_cast<int>(info.image_height);
    jpeg_destroy_decompress(&info);
    return true;
  }
  info.out_color_space = info.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  // The output size from the header alone, before jpeg_start_decompress
  // allocates for it (a progressive JPEG's whole-image coefficient buffers).
  jpeg_calc_output_dimensions(&info);
  const size_t stride = static_cast<size_t>(info.output_width) * static_cast<size_t>(info.output_components);
  if (info.output_height != 0 && stride > kMaxDecodedImageBytes / info.output_height) {
    // A few bytes of header may claim 65535 x 65535 pixels: refused before
    // anything that size is allocated or decoded (found by the fuzzer).
    std::snprintf(state->message, sizeof(state->message), "%ux%u pixels decode to more than %zu MiB",
                  static_cast<unsigned>(info.output_width), static_cast<unsigned>(info.output_height),
                  kMaxDecodedImageBytes >> 20);
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_start_decompress(&info);
  result->pixels = static_cast<uint8_t*>(std::malloc(stride * info.output_height));
  if (result->pixels == nullptr) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = result->pixels + info.output_scanline * stride;
    jpeg_read_scanlines(&info, &row, 1);
  }
  result->width = static_cast<int>(info.output_width);
  result->height = static_cast<int>(info.output_height);
  result->channels = info.output_components;
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}

}  // namespace

absl::StatusOr<std::string> EncodeJpeg(int width, int height, int channels, const uint8_t* pixels, int quality) {
  // JPEG's frame header holds 16-bit sizes.
  if (width <= 0 || height <= 0 || width > 65535 || height > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG sizes are 1..65535; the image is ", width, "x", height));
  }
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG needs 1 or 3 channels, got ", channels));
  }
  if (quality < 1 || quality > 100) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG quality must be 1..100, got ", quality));
  }
  if (pixels == nullptr) return absl::InvalidArgumentError("pixels is null");
  JpegErrorState state;
  InitErrors(&state);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const bool ok = CompressRows(width, height, channels, pixels, quality, &buffer, &size, &state);
  std::string out;
  if (ok && buffer != nullptr) out.assign(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  if (!ok) return absl::InternalError(absl::StrCat("encoding JPEG failed: ", state.message));
  return out;
}

absl::StatusOr<JpegImage> DecodeJpeg(const std::string& bytes) {
  if (bytes.size() < 2 || static_cast<uint8_t>(bytes[0]) != 0xFF || static_cast<uint8_t>(bytes[1]) != 0xD8) {
    return absl::InvalidArgumentError("not a JPEG (no SOI marker)");
  }
  JpegErrorState state;
  InitErrors(&state);
  DecodedRows rows{};
  const bool ok = DecompressRows(bytes, &rows, &state);
  JpegImage image;
  if (ok) {
    image.width = rows.width;
    image.height = rows.height;
    image.channels = rows.channels;
    image.pixels.assign(rows.pixels, rows.pixels + static_cast<size_t>(rows.width) * rows.height * rows.channels);
  }
  std::free(rows.pixels);
  if (!ok)
    return absl::InvalidArgumentError(absl::StrCat("bad JPEG: ", state.message[0] ? state.message : "out of memory"));
  return image;
}

absl::StatusOr<std::pair<int, int>> JpegSize(const std::string& bytes) {
  if (bytes.size() < 2 || static_cast<uint8_t>(bytes[0]) != 0xFF || static_cast<uint8_t>(bytes[1]) != 0xD8) {
    return absl::InvalidArgumentError("not a JPEG (no SOI marker)");
  }
  JpegErrorState state;
  InitErrors(&state);
  DecodedRows header{};
  if (!DecompressRows(bytes, &header, &state, /*header_only=*/true)) {
    return absl::InvalidArgumentError(absl::StrCat("bad JPEG: ", state.message));
  }
  return std::make_pair(header.width, header.height);
}

}  // namespace vaedecode::formats
