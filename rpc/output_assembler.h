#pragma once

// Reassembles a Decode stream (Header, Chunks, Trailer) into whole outputs,
// checking it as it goes: for vaedecode_client, the CLI and the server's
// unary protocols (HTTP, OIP) alike. No torch: plain bytes in the header's
// layout, each format's as rpc/output_formats.h describes it.
//
// Chunk layout (vaedecode.v1.Chunk): for tensor outputs a chunk holds rows
// [row_begin, row_end) of one image (batch_index) and frame, for every
// channel, in the header shape's layout restricted to those rows:
//   FLOAT32/FLOAT16, shape [B, C, H, W] or [B, C, T, H, W]: [C, rows, W]
//   UINT8,           shape [B, H, W, C] or [B, T, H, W, C]: [rows, W, C]
//   an audio waveform, shape [B, C, S]: [C, rows], its rows being samples
// For PNG and JPEG, a chunk is one file of one image / frame (for MP4 and WAV, of one
// batch entry's video, frame 0), or a piece of one
// when the file is larger than the chunk limit (consecutive chunks of the
// same image and frame, concatenated in order).
//
// Threading: one thread at a time.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// The largest dimension a stream's header may give (a waveform's samples
// included: over 11 minutes at 24 kHz); the server refuses larger outputs.
inline constexpr int64_t kMaxOutputDimension = int64_t{1} << 24;

class OutputAssembler {
 public:
  // Takes the next message of the stream. INVALID_ARGUMENT (DATA_LOSS for
  // missing data) when the stream breaks the protocol.
  absl::Status Add(const v1::DecodeResponse& message);
  // The stream ended: every row (every image file) must have arrived, and the trailer.
  absl::Status Finish() const;

  bool has_header() const { return has_header_; }
  const v1::Header& header() const { return header_; }
  const v1::Trailer& trailer() const { return trailer_; }
  int64_t chunks() const { return chunks_; }

  // Tensor outputs: the whole output, C order in header().shape(), of
  // header().dtype() elements.
  const std::string& tensor_bytes() const { return tensor_; }
  // PNG and JPEG outputs: one file per image/frame, index b * frames + t;
  // MP4: one file per batch entry b.
  const std::vector<std::string>& images() const { return images_; }
  // Move the output out; the assembler is spent afterwards.
  std::string TakeTensorBytes() { return std::move(tensor_); }
  std::vector<std::string> TakeImages() { return std::move(images_); }

 private:
  absl::Status AddHeader(const v1::Header& header);
  absl::Status AddChunk(const v1::Chunk& chunk);

  bool has_header_ = false;
  bool has_trailer_ = false;
  v1::Header header_;
  v1::Trailer trailer_;
  int64_t chunks_ = 0;
  // Geometry of tensor outputs.
  int64_t batch_ = 0, channels_ = 0, frames_ = 0, height_ = 0, width_ = 0, elem_ = 0;
  bool channels_last_ = false;
  bool encoded_ = false;         // PNG, JPEG or MP4 files
  bool file_per_entry_ = false;  // MP4, WAV: one file per batch entry
  std::string tensor_;
  std::vector<int64_t> rows_seen_;  // per (b, t): rows received
  std::vector<std::string> images_;
  int64_t last_image_ = -1;  // the image the previous file chunk belonged to
};

}  // namespace vaedecode::rpc
