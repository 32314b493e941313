#include "rpc/session_stream.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rpc/output_formats.h"

namespace vaedecode::rpc {

absl::StatusOr<std::vector<int64_t>> ParseStreamChunks(absl::string_view flag, absl::string_view text,
                                                       int64_t latent_frames) {
  std::vector<int64_t> chunks;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t t = 0;
    if (!absl::SimpleAtoi(part, &t) || t < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must list positive latent frame counts (e.g. 1,2,2), got \"", text, "\""));
    }
    chunks.push_back(t);
  }
  const int64_t total = std::accumulate(chunks.begin(), chunks.end(), int64_t{0});
  if (total != latent_frames) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " adds up to ", total, " latent frames; the latent has ", latent_frames));
  }
  return chunks;
}

absl::StatusOr<v1::SessionOpen> SessionOpenFor(const v1::DecodeRequest& whole) {
  // The noise scale defaults to the timestep (DecodeRequest).
  const double noise = whole.has_decode_noise_scale() ? whole.decode_noise_scale() : whole.decode_timestep();
  if (whole.decode_timestep() != 0 || noise != 0) {
    return absl::InvalidArgumentError(
        "a session decodes at the default decode timestep (0) without noise (noise drawn a chunk at a time is not "
        "the whole clip's): drop decode_timestep and decode_noise_scale, or mix the noise into the latent");
  }
  v1::SessionOpen open;
  open.set_model(whole.model());
  open.set_latent_space(whole.latent_space());
  open.set_output_format(whole.output_format());
  open.set_latent_dtype(whole.latent().dtype());
  const auto& s = whole.latent().shape();
  if (s.size() == 5) {
    for (int64_t d : {s[0], s[1], s[3], s[4]}) open.add_shape(d);
  }
  open.set_mode(whole.mode());
  open.set_session_id(whole.request_id());
  open.set_jpeg_quality(whole.jpeg_quality());
  if (whole.has_png_compression()) open.set_png_compression(whole.png_compression());
  if (whole.has_scaling_factor()) open.set_scaling_factor(whole.scaling_factor());
  if (whole.has_shift_factor()) open.set_shift_factor(whole.shift_factor());
  return open;
}

v1::Tensor LatentFrames(const v1::Tensor& latent, int64_t begin, int64_t count) {
  v1::Tensor part;
  part.set_dtype(latent.dtype());
  *part.mutable_shape() = latent.shape();
  part.set_shape(2, count);
  // C order: each (batch, channel) holds its frames contiguously.
  const int64_t blocks = latent.shape(0) * latent.shape(1);
  const size_t frame = latent.data().size() / static_cast<size_t>(blocks * latent.shape(2));
  std::string* data = part.mutable_data();
  data->reserve(static_cast<size_t>(blocks * count) * frame);
  for (int64_t b = 0; b < blocks; ++b) {
    data->append(latent.data(), static_cast<size_t>(b * latent.shape(2) + begin) * frame,
                 static_cast<size_t>(count) * frame);
  }
  return part;
}

absl::Status SessionAssembler::Add(const v1::DecodeResponse& message) {
  if (has_trailer_) return absl::InvalidArgumentError("session: a message after the final trailer");
  if (message.kind_case() == v1::DecodeResponse::kSessionHeader) {
    if (has_header_) return absl::InvalidArgumentError("session: a second header");
    header_ = message.session_header();
    has_header_ = true;
    return absl::OkStatus();
  }
  if (!has_header_) return absl::InvalidArgumentError("session: a message before the session header");
  switch (message.kind_case()) {
    case v1::DecodeResponse::kChunk: {
      const v1::Chunk& c = message.chunk();
      if (c.frame() < frames_) {
        return absl::InvalidArgumentError(
            absl::StrCat("session: a chunk of frame ", c.frame(), ", which an earlier chunk trailer closed"));
      }
      frames_in_chunk_ = std::max(frames_in_chunk_, c.frame() + 1);
      chunks_.push_back(c);
      return absl::OkStatus();
    }
    case v1::DecodeResponse::kChunkTrailer: {
      const v1::ChunkTrailer& t = message.chunk_trailer();
      if (t.chunk() != static_cast<int64_t>(chunk_trailers_.size()) || t.first_frame() != frames_ || t.frames() < 0 ||
          frames_in_chunk_ > frames_ + t.frames()) {
        return absl::InvalidArgumentError(absl::StrCat("session: chunk trailer ", t.chunk(), " (frames ",
                                                       t.first_frame(), " + ", t.frames(), ") out of order after ",
                                                       frames_, " frames"));
      }
      frames_ += t.frames();
      frames_in_chunk_ = frames_;
      chunk_trailers_.push_back(t);
      return absl::OkStatus();
    }
    case v1::DecodeResponse::kTrailer:
      has_trailer_ = true;
      trailer_ = message.trailer();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("session: a Decode header or an empty message in a session");
  }
}

absl::Status SessionAssembler::Finish() {
  if (!has_trailer_) return absl::DataLossError("session: the stream ended without its final trailer");
  if (frames_ == 0) return absl::DataLossError("session: no frame was decoded");
  const OutputFormatInfo* format = FindOutputFormat(header_.output_format());
  if (format == nullptr || header_.shape_size() != 5) return absl::InvalidArgumentError("session: a bad header");
  v1::DecodeResponse whole;
  v1::Header* h = whole.mutable_header();
  h->set_request_id(header_.session_id());
  *h->mutable_shape() = header_.shape();
  h->set_shape(format->channels_last ? 1 : 2, frames_);
  h->set_dtype(header_.dtype());
  h->set_output_format(header_.output_format());
  h->set_mode(header_.mode());
  h->set_degree(header_.degree());
  h->set_mode_reason(header_.mode_reason());
  h->set_frames(frames_);
  h->set_height(header_.height());
  h->set_width(header_.width());
  if (absl::Status s = clip_.Add(whole); !s.ok()) return s;
  for (v1::Chunk& c : chunks_) {
    v1::DecodeResponse m;
    *m.mutable_chunk() = std::move(c);
    if (absl::Status s = clip_.Add(m); !s.ok()) return s;
  }
  chunks_.clear();
  v1::DecodeResponse end;
  *end.mutable_trailer() = trailer_;
  if (absl::Status s = clip_.Add(end); !s.ok()) return s;
  return clip_.Finish();
}

}  // namespace vaedecode::rpc
