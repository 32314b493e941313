#include "worker/output_stream.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "formats/jpeg.h"
#include "formats/mp4.h"
#include "formats/png.h"
#include "formats/tensor_file.h"
#include "formats/wav.h"
#include "rpc/output_formats.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {
namespace {

// An output as images of rows: a waveform [B, C, S] is one image per batch
// entry of S rows (its samples) and one column.
struct Geometry {
  int64_t batch, channels, frames, height, width;
  rpc::OutputKind kind;
  bool video() const { return kind == rpc::OutputKind::kVideo; }
};

absl::StatusOr<Geometry> GeometryOf(const std::vector<int64_t>& s) {
  if (s.size() == 3) return Geometry{s[0], s[1], 1, s[2], 1, rpc::OutputKind::kWaveform};
  if (s.size() != 4 && s.size() != 5) {
    return absl::InternalError(absl::StrCat("decoded sample has ", s.size(), " dimensions"));
  }
  const bool video = s.size() == 5;
  return Geometry{s[0],
                  s[1],
                  video ? s[2] : 1,
                  s[s.size() - 2],
                  s[s.size() - 1],
                  video ? rpc::OutputKind::kVideo : rpc::OutputKind::kImage};
}

absl::StatusOr<Geometry> GeometryOf(const at::Tensor& sample) { return GeometryOf(sample.sizes().vec()); }

at::ScalarType TensorType(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT16:
      return at::kHalf;
    case v1::BFLOAT16:
      return at::kBFloat16;
    case v1::UINT8:
      return at::kByte;
    default:
      return at::kFloat;
  }
}

int64_t RowsPerChunk(int64_t bytes_per_row, int64_t max_chunk_bytes) {
  return std::max<int64_t>(1, max_chunk_bytes / std::max<int64_t>(1, bytes_per_row));
}

}  // namespace

OutputEncoding EncodingOf(const v1::DecodeRequest& request, const families::PixelConvention& pixels,
                          int64_t sample_rate) {
  OutputEncoding encoding;
  encoding.pixels = pixels;
  encoding.sample_rate = sample_rate;
  encoding.format = request.output_format();
  encoding.jpeg_quality = request.jpeg_quality() > 0 ? request.jpeg_quality() : formats::kDefaultJpegQuality;
  encoding.png_compression =
      request.has_png_compression() ? request.png_compression() : formats::kDefaultPngCompression;
  encoding.fps = request.fps() > 0 ? request.fps() : formats::kDefaultVideoFps;
  return encoding;
}

absl::Status DescribeOutput(const at::Tensor& sample, v1::OutputFormat format, v1::Header* header) {
  return DescribeOutput(sample.sizes().vec(), format, header);
}

absl::Status DescribeOutput(const std::vector<int64_t>& shape, v1::OutputFormat format, v1::Header* header) {
  ASSIGN_OR_RETURN(Geometry g, GeometryOf(shape));
  header->clear_shape();
  header->set_output_format(format);
  header->set_frames(g.frames);
  header->set_height(g.height);
  header->set_width(g.width);
  // What each format holds and which outputs it fits: rpc/output_formats.h.
  const rpc::OutputFormatInfo* info = rpc::FindOutputFormat(format);
  if (info == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("unknown output format ", static_cast<int>(format)));
  header->set_dtype(info->dtype);
  if (!info->channels_last) {
    for (int64_t s : shape) header->add_shape(s);
  } else {
    header->add_shape(g.batch);
    if (g.video()) header->add_shape(g.frames);
    header->add_shape(g.height);
    header->add_shape(g.width);
    header->add_shape(g.channels);
  }
  // Channels are the model's to fit (rpc::ValidateOutputFormat); an audio
  // output's formats take any.
  return rpc::CheckOutputFits(format, g.kind == rpc::OutputKind::kWaveform ? 0 : g.channels, g.kind,
                              "the decoded sample");
}

absl::StatusOr<at::Tensor> MuxableAudio(const at::Tensor& waveform, int64_t clips) {
  if (waveform.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an audio track is a waveform [B, channels, samples]; the audio decoded to ", waveform.dim(), " dimensions"));
  }
  at::Tensor audio = waveform.to(at::kFloat).cpu().contiguous();
  if (audio.size(0) == 2 * clips && audio.size(1) == 1) return audio.view({clips, 2, audio.size(2)});
  if (audio.size(0) != clips) {
    return absl::InvalidArgumentError(
        absl::StrCat("audio_latent: a batch of ", audio.size(0), " beside ", clips, " video clip(s)"));
  }
  return audio;
}

absl::Status EmitChunks(const at::Tensor& decoded, const OutputEncoding& encoding, int64_t max_chunk_bytes,
                        const std::function<bool(v1::Chunk&&)>& emit) {
  const v1::OutputFormat format = encoding.format;
  const at::Tensor sample = decoded.cpu();  // GPU decodes stream from host memory
  ASSIGN_OR_RETURN(Geometry g, GeometryOf(sample));
  auto send = [&](int64_t b, int64_t f, int64_t r0, int64_t r1, const void* data, size_t n) {
    v1::Chunk chunk;
    chunk.set_batch_index(b);
    chunk.set_frame(f);
    chunk.set_row_begin(r0);
    chunk.set_row_end(r1);
    chunk.set_data(static_cast<const char*>(data), n);
    return emit(std::move(chunk));
  };
  const absl::Status cancelled = absl::CancelledError("the output stream was closed");

  const rpc::OutputFormatInfo* info = rpc::FindOutputFormat(format);
  if (info == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("unknown output format ", static_cast<int>(format)));
  if (!info->encoded && !info->channels_last) {  // the sample itself, in the format's dtype
    const at::Tensor values = sample.to(TensorType(info->dtype));
    const int64_t row_bytes = g.channels * g.width * values.element_size();
    const int64_t step = RowsPerChunk(row_bytes, max_chunk_bytes);
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t f = 0; f < g.frames; ++f) {
        at::Tensor image = g.video() ? values[b].select(1, f) : values[b];  // [C, H, W], a waveform's [C, S]
        for (int64_t r0 = 0; r0 < g.height; r0 += step) {
          const int64_t r1 = std::min(g.height, r0 + step);
          const at::Tensor rows = image.narrow(1, r0, r1 - r0).contiguous();
          if (!send(b, f, r0, r1, rows.data_ptr(), rows.nbytes())) return cancelled;
        }
      }
    }
    return absl::OkStatus();
  }

  const size_t piece = static_cast<size_t>(std::max<int64_t>(1, max_chunk_bytes));
  if (format == v1::OUTPUT_WAV || format == v1::OUTPUT_WAV_FLOAT32) {
    for (int64_t b = 0; b < g.batch; ++b) {
      // Interleaved: [samples, channels], frame-major.
      const at::Tensor frames = sample[b].to(at::kFloat).transpose(0, 1).contiguous();
      const float* data = frames.data_ptr<float>();
      ASSIGN_OR_RETURN(
          std::string wav,
          formats::EncodeWav(std::vector<float>(data, data + frames.numel()), g.channels, encoding.sample_rate,
                             format == v1::OUTPUT_WAV ? formats::WavEncoding::kPcm16 : formats::WavEncoding::kFloat32));
      for (size_t offset = 0; offset < wav.size(); offset += piece) {
        const size_t n = std::min(piece, wav.size() - offset);
        if (!send(b, 0, 0, g.height, wav.data() + offset, n)) return cancelled;
      }
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const at::Tensor pixels,
                   formats::ToImagePixels(encoding.pixels.ToSymmetric(sample)));  // [B, T, H, W, C]
  if (format == v1::OUTPUT_MP4) {
    formats::Mp4Options mp4;
    mp4.fps = encoding.fps;
    for (int64_t b = 0; b < g.batch; ++b) {
      const at::Tensor clip = pixels[b].contiguous();  // [T, H, W, 3]
      at::Tensor audio;                                // [samples, channels], interleaved
      if (encoding.audio.defined()) {
        if (encoding.audio.size(0) != g.batch) {
          return absl::InternalError("the audio track's batch is not the video's");
        }
        audio = encoding.audio[b].to(at::kFloat).transpose(0, 1).contiguous();
        mp4.audio = formats::Mp4Audio{audio.data_ptr<float>(), audio.size(0), static_cast<int>(audio.size(1)),
                                      static_cast<int>(encoding.audio_sample_rate)};
      }
      ASSIGN_OR_RETURN(std::string video,
                       formats::EncodeMp4(static_cast<int>(g.width), static_cast<int>(g.height),
                                          static_cast<int>(g.frames), clip.data_ptr<uint8_t>(), mp4));
      for (size_t offset = 0; offset < video.size(); offset += piece) {
        const size_t n = std::min(piece, video.size() - offset);
        if (!send(b, 0, 0, g.height, video.data() + offset, n)) return cancelled;
      }
    }
    return absl::OkStatus();
  }
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t f = 0; f < g.frames; ++f) {
      const at::Tensor image = pixels[b][f];  // [H, W, C], contiguous
      if (format == v1::OUTPUT_UINT8) {
        const int64_t step = RowsPerChunk(g.width * g.channels, max_chunk_bytes);
        for (int64_t r0 = 0; r0 < g.height; r0 += step) {
          const int64_t r1 = std::min(g.height, r0 + step);
          const at::Tensor rows = image.narrow(0, r0, r1 - r0);
          if (!send(b, f, r0, r1, rows.data_ptr(), rows.nbytes())) return cancelled;
        }
        continue;
      }
      const int width = static_cast<int>(g.width), height = static_cast<int>(g.height);
      const int channels = static_cast<int>(g.channels);
      ASSIGN_OR_RETURN(
          std::string encoded,
          format == v1::OUTPUT_JPEG
              ? formats::EncodeJpeg(width, height, channels, image.data_ptr<uint8_t>(), encoding.jpeg_quality)
              : formats::EncodePng(width, height, channels, image.data_ptr<uint8_t>(), encoding.png_compression));
      for (size_t offset = 0; offset < encoded.size(); offset += piece) {
        const size_t n = std::min(piece, encoded.size() - offset);
        if (!send(b, f, 0, g.height, encoded.data() + offset, n)) return cancelled;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace vaedecode::worker
