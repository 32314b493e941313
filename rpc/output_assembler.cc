#include "rpc/output_assembler.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/output_formats.h"

namespace vaedecode::rpc {

absl::Status OutputAssembler::Add(const v1::DecodeResponse& message) {
  if (has_trailer_) return absl::InvalidArgumentError("stream: a message after the trailer");
  switch (message.kind_case()) {
    case v1::DecodeResponse::kHeader:
      if (has_header_) return absl::InvalidArgumentError("stream: a second header");
      return AddHeader(message.header());
    case v1::DecodeResponse::kChunk:
      if (!has_header_) return absl::InvalidArgumentError("stream: a chunk before the header");
      return AddChunk(message.chunk());
    case v1::DecodeResponse::kTrailer:
      if (!has_header_) return absl::InvalidArgumentError("stream: a trailer before the header");
      has_trailer_ = true;
      trailer_ = message.trailer();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("stream: an empty message");
  }
}

absl::Status OutputAssembler::AddHeader(const v1::Header& header) {
  header_ = header;
  has_header_ = true;
  const int rank = header.shape_size();
  if (rank != 3 && rank != 4 && rank != 5) {
    return absl::InvalidArgumentError(absl::StrCat("header: shape of rank ", rank));
  }
  for (int64_t d : header.shape()) {
    if (d < 1 || d > kMaxOutputDimension) {
      return absl::InvalidArgumentError("header: a dimension out of range");
    }
  }
  const bool video = rank == 5;
  const auto& s = header.shape();
  const OutputFormatInfo* format = FindOutputFormat(header.output_format());
  if (format == nullptr) return absl::InvalidArgumentError("header: unknown output format");
  file_per_entry_ = format->chunking == Chunking::kFilePerEntry;
  encoded_ = format->encoded;
  channels_last_ = format->channels_last;
  elem_ = ElementSize(format->dtype);
  batch_ = s[0];
  if (rank == 3) {  // a waveform [B, C, S]: S rows (samples) of one column
    channels_ = s[1];
    frames_ = 1;
    height_ = s[2];
    width_ = 1;
  } else if (channels_last_) {  // [B, (T,) H, W, C]
    frames_ = video ? s[1] : 1;
    height_ = s[video ? 2 : 1];
    width_ = s[video ? 3 : 2];
    channels_ = s[video ? 4 : 3];
  } else {  // [B, C, (T,) H, W]
    channels_ = s[1];
    frames_ = video ? s[2] : 1;
    height_ = s[video ? 3 : 2];
    width_ = s[video ? 4 : 3];
  }
  const int64_t images = batch_ * frames_;
  if (encoded_) {
    images_.assign(file_per_entry_ ? batch_ : images, "");
    return absl::OkStatus();
  }
  const int64_t total = images * channels_ * height_ * width_ * elem_;
  if (total > (int64_t{1} << 34)) return absl::InvalidArgumentError("header: output too large");
  tensor_.assign(total, '\0');
  rows_seen_.assign(images, 0);
  return absl::OkStatus();
}

absl::Status OutputAssembler::AddChunk(const v1::Chunk& c) {
  ++chunks_;
  if (c.batch_index() < 0 || c.batch_index() >= batch_ || c.frame() < 0 || c.frame() >= frames_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: batch ", c.batch_index(), " frame ", c.frame(), " outside the header's shape"));
  }
  if (file_per_entry_ && c.frame() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: a file piece of frame ", c.frame(), " (a batch entry's file is frame 0)"));
  }
  const int64_t image = file_per_entry_ ? c.batch_index() : c.batch_index() * frames_ + c.frame();
  if (encoded_) {
    if (c.data().empty()) return absl::InvalidArgumentError("chunk: an empty image piece");
    // Pieces of one image file are consecutive; an image never comes back later.
    if (image != last_image_ && !images_[image].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk: image ", image, " sent twice"));
    }
    last_image_ = image;
    images_[image] += c.data();
    return absl::OkStatus();
  }
  const int64_t r0 = c.row_begin(), r1 = c.row_end();
  if (r0 < 0 || r1 <= r0 || r1 > height_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk: rows [", r0, ", ", r1, ") outside [0, ", height_, ")"));
  }
  const int64_t rows = r1 - r0;
  const int64_t row_bytes = width_ * elem_ * (channels_last_ ? channels_ : 1);
  const int64_t want = rows * row_bytes * (channels_last_ ? 1 : channels_);
  if (static_cast<int64_t>(c.data().size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: ", c.data().size(), " bytes for rows [", r0, ", ", r1, "), expected ", want));
  }
  const char* src = c.data().data();
  if (channels_last_) {
    // Image `image` is [H, W, C]; the rows are contiguous.
    char* dst = tensor_.data() + (image * height_ + r0) * row_bytes;
    std::memcpy(dst, src, want);
  } else {
    // Output index of (b, ch, t, y): ((b * C + ch) * T + t) * H + y rows.
    for (int64_t ch = 0; ch < channels_; ++ch) {
      const int64_t plane = (c.batch_index() * channels_ + ch) * frames_ + c.frame();
      char* dst = tensor_.data() + (plane * height_ + r0) * row_bytes;
      std::memcpy(dst, src + ch * rows * row_bytes, rows * row_bytes);
    }
  }
  rows_seen_[image] += rows;
  return absl::OkStatus();
}

absl::Status OutputAssembler::Finish() const {
  if (!has_header_) return absl::DataLossError("stream: no header");
  if (encoded_) {
    for (size_t i = 0; i < images_.size(); ++i) {
      if (images_[i].empty()) return absl::DataLossError(absl::StrCat("stream: image file ", i, " missing"));
    }
  } else {
    for (size_t i = 0; i < rows_seen_.size(); ++i) {
      if (rows_seen_[i] != height_) {
        return absl::DataLossError(absl::StrCat("stream: image ", i, " got ", rows_seen_[i], " of ", height_, " rows"));
      }
    }
  }
  if (!has_trailer_) return absl::DataLossError("stream: no trailer");
  return absl::OkStatus();
}

}  // namespace vaedecode::rpc
