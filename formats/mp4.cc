#include "formats/mp4.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

// FFmpeg is loaded when the first video is encoded, not linked: the
// binaries (and the GPU bundle, the images) do not carry its dozens of codec
// libraries, and a machine without them still serves everything but MP4.
// The sonames are the headers' own major versions (Debian 12: libavcodec59).
#define VAEDECODE_FFMPEG_FUNCTIONS(X)         \
  X(avutil, av_log_set_level)                 \
  X(avutil, av_strerror)                      \
  X(avutil, av_malloc)                        \
  X(avutil, av_free)                          \
  X(avutil, av_freep)                         \
  X(avutil, av_frame_alloc)                   \
  X(avutil, av_frame_free)                    \
  X(avutil, av_frame_get_buffer)              \
  X(avutil, av_frame_make_writable)           \
  X(avutil, av_opt_set)                       \
  X(avutil, av_opt_set_int)                   \
  X(avutil, av_channel_layout_default)        \
  X(avutil, av_channel_layout_copy)           \
  X(avcodec, avcodec_find_encoder_by_name)    \
  X(avcodec, avcodec_find_decoder)            \
  X(avcodec, avcodec_alloc_context3)          \
  X(avcodec, avcodec_free_context)            \
  X(avcodec, avcodec_open2)                   \
  X(avcodec, avcodec_parameters_from_context) \
  X(avcodec, avcodec_parameters_to_context)   \
  X(avcodec, avcodec_send_frame)              \
  X(avcodec, avcodec_receive_packet)          \
  X(avcodec, avcodec_send_packet)             \
  X(avcodec, avcodec_receive_frame)           \
  X(avcodec, av_packet_alloc)                 \
  X(avcodec, av_packet_free)                  \
  X(avcodec, av_packet_unref)                 \
  X(avcodec, av_packet_rescale_ts)            \
  X(avformat, avformat_alloc_output_context2) \
  X(avformat, avformat_free_context)          \
  X(avformat, avio_alloc_context)             \
  X(avformat, avio_context_free)              \
  X(avformat, avformat_new_stream)            \
  X(avformat, avformat_write_header)          \
  X(avformat, av_interleaved_write_frame)     \
  X(avformat, av_write_trailer)               \
  X(avformat, avio_flush)                     \
  X(avformat, avformat_alloc_context)         \
  X(avformat, avformat_open_input)            \
  X(avformat, avformat_close_input)           \
  X(avformat, avformat_find_stream_info)      \
  X(avformat, av_find_best_stream)            \
  X(avformat, av_read_frame)                  \
  X(avformat, av_find_input_format)           \
  X(swscale, sws_isSupportedInput)            \
  X(swscale, sws_getContext)                  \
  X(swscale, sws_freeContext)                 \
  X(swscale, sws_scale)

struct Ffmpeg {
#define VAEDECODE_DECLARE(lib, name) decltype(&::name) name = nullptr;
  VAEDECODE_FFMPEG_FUNCTIONS(VAEDECODE_DECLARE)
#undef VAEDECODE_DECLARE
};

const char* const kSonames[] = {
    "libavutil.so." AV_STRINGIFY(LIBAVUTIL_VERSION_MAJOR),
    "libavcodec.so." AV_STRINGIFY(LIBAVCODEC_VERSION_MAJOR),
    "libavformat.so." AV_STRINGIFY(LIBAVFORMAT_VERSION_MAJOR),
    "libswscale.so." AV_STRINGIFY(LIBSWSCALE_VERSION_MAJOR),
};

// Loads the four libraries once; the result is kept for the process.
const absl::StatusOr<Ffmpeg>& LoadFfmpeg() {
  static const absl::StatusOr<Ffmpeg>* loaded = [] {
    void* handles[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int i = 0; i < 4; ++i) {
      handles[i] = dlopen(kSonames[i], RTLD_NOW | RTLD_LOCAL);
      if (handles[i] == nullptr) {
        return new absl::StatusOr<Ffmpeg>(absl::UnavailableError(absl::StrCat(
            "MP4 output needs FFmpeg's ", kSonames[i],
            " on the worker's machine (Debian: apt-get install libavcodec59 libavformat59 libswscale6): ", dlerror())));
      }
    }
    const auto handle = [&handles](absl::string_view lib) {
      return lib == "avutil" ? handles[0] : lib == "avcodec" ? handles[1] : lib == "avformat" ? handles[2] : handles[3];
    };
    Ffmpeg ff;
    std::string missing;
#define VAEDECODE_LOAD(lib, name)                                            \
  ff.name = reinterpret_cast<decltype(&::name)>(dlsym(handle(#lib), #name)); \
  if (ff.name == nullptr) missing += " " #name;
    VAEDECODE_FFMPEG_FUNCTIONS(VAEDECODE_LOAD)
#undef VAEDECODE_LOAD
    if (!missing.empty()) {
      return new absl::StatusOr<Ffmpeg>(absl::UnavailableError(absl::StrCat("FFmpeg lacks:", missing)));
    }
    // x264 and the muxer log at info level, the decoders every flaw of a
    // client's bytes: errors come back as Status, never on stderr.
    ff.av_log_set_level(AV_LOG_QUIET);
    return new absl::StatusOr<Ffmpeg>(ff);
  }();
  return *loaded;
}

constexpr int kSwsFlags = SWS_BICUBIC | SWS_ACCURATE_RND | SWS_BITEXACT;

// Only called once LoadFfmpeg succeeded.
const Ffmpeg& Ff() { return *LoadFfmpeg(); }

std::string AvError(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  Ff().av_strerror(code, text, sizeof(text));
  return text;
}

// A growable in-memory file for libavformat's custom I/O (seekable, so the
// MP4 muxer can write its index at the end).
struct MemoryFile {
  std::string data;
  int64_t position = 0;

  static int Write(void* opaque, uint8_t* buf, int size) {  // FFmpeg 5 passes non-const
    auto* f = static_cast<MemoryFile*>(opaque);
    const size_t end = static_cast<size_t>(f->position) + static_cast<size_t>(size);
    if (end > f->data.size()) f->data.resize(end);
    std::memcpy(f->data.data() + f->position, buf, static_cast<size_t>(size));
    f->position = static_cast<int64_t>(end);
    return size;
  }
  static int Read(void* opaque, uint8_t* buf, int size) {
    auto* f = static_cast<MemoryFile*>(opaque);
    const int64_t left = static_cast<int64_t>(f->data.size()) - f->position;
    if (left <= 0) return AVERROR_EOF;
    const int n = static_cast<int>(std::min<int64_t>(left, size));
    std::memcpy(buf, f->data.data() + f->position, static_cast<size_t>(n));
    f->position += n;
    return n;
  }
  static int64_t Seek(void* opaque, int64_t offset, int whence) {
    auto* f = static_cast<MemoryFile*>(opaque);
    const int64_t size = static_cast<int64_t>(f->data.size());
    if (whence == AVSEEK_SIZE) return size;
    int64_t target = offset;
    if ((whence & ~AVSEEK_FORCE) == SEEK_CUR) target = f->position + offset;
    if ((whence & ~AVSEEK_FORCE) == SEEK_END) target = size + offset;
    if (target < 0) return AVERROR(EINVAL);
    f->position = target;
    return target;
  }
};

// Owners for FFmpeg's C objects.
struct IoDeleter {
  void operator()(AVIOContext* io) const {
    if (io != nullptr) Ff().av_freep(&io->buffer);
    Ff().avio_context_free(&io);
  }
};
struct CodecDeleter {
  void operator()(AVCodecContext* c) const { Ff().avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { Ff().av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { Ff().av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { Ff().sws_freeContext(s); }
};
using Io = std::unique_ptr<AVIOContext, IoDeleter>;
using Codec = std::unique_ptr<AVCodecContext, CodecDeleter>;
using Frame = std::unique_ptr<AVFrame, FrameDeleter>;
using Packet = std::unique_ptr<AVPacket, PacketDeleter>;
using Sws = std::unique_ptr<SwsContext, SwsDeleter>;

Io MakeIo(MemoryFile* file, bool writable) {
  constexpr int kBuffer = 1 << 16;
  auto* buffer = static_cast<unsigned char*>(Ff().av_malloc(kBuffer));
  if (buffer == nullptr) return nullptr;
  AVIOContext* io =
      Ff().avio_alloc_context(buffer, kBuffer, writable ? 1 : 0, file, writable ? nullptr : MemoryFile::Read,
                              writable ? MemoryFile::Write : nullptr, MemoryFile::Seek);
  if (io == nullptr) Ff().av_free(buffer);
  return Io(io);
}

absl::Status Failed(const char* what, int code) {
  return absl::InternalError(absl::StrCat("MP4 ", what, ": ", AvError(code)));
}

// Reading a client's bytes: what fails is the bytes.
absl::Status Unreadable(const char* what, int code) {
  return absl::InvalidArgumentError(absl::StrCat("the MP4's ", what, " failed: ", AvError(code)));
}

// The audio track: AAC-LC (FFmpeg's native encoder), stereo, at the
// waveform's own rate, as diffusers' encode_video writes LTX-2's audio.
struct AudioTrack {
  Codec codec;
  AVStream* stream = nullptr;
};

}  // namespace

bool IsAacSampleRate(int64_t rate) {
  for (const int64_t r : {96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350}) {
    if (rate == r) return true;
  }
  return false;
}

namespace {

absl::Status CheckAudio(const Mp4Audio& audio) {
  if (audio.samples == nullptr || audio.frames < 1) return absl::InvalidArgumentError("MP4 audio: no samples");
  if (audio.channels != 1 && audio.channels != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("MP4 audio: mono or stereo waveforms are muxed; this one has ", audio.channels, " channels"));
  }
  if (!IsAacSampleRate(audio.sample_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MP4 audio: AAC takes MPEG-4's rates (7350 to 96000 Hz: 16000, 22050, 24000, 32000, 44100, 48000, ...); the "
        "waveform is at ",
        audio.sample_rate, " Hz"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AudioTrack> OpenAudioTrack(AVFormatContext* format, const Mp4Audio& audio) {
  const AVCodec* aac = Ff().avcodec_find_encoder_by_name("aac");
  if (aac == nullptr) return absl::UnavailableError("this FFmpeg has no AAC encoder");
  AudioTrack track{Codec(Ff().avcodec_alloc_context3(aac)), nullptr};
  if (!track.codec) return absl::ResourceExhaustedError("MP4: no memory for the audio encoder");
  AVCodecContext* c = track.codec.get();
  c->sample_fmt = AV_SAMPLE_FMT_FLTP;
  c->sample_rate = audio.sample_rate;
  Ff().av_channel_layout_default(&c->ch_layout, 2);  // mono is written on both channels
  c->bit_rate = 192000;
  c->time_base = AVRational{1, audio.sample_rate};
  c->flags |= AV_CODEC_FLAG_BITEXACT;
  if (format->oformat->flags & AVFMT_GLOBALHEADER) c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  int rc = Ff().avcodec_open2(c, aac, nullptr);
  if (rc < 0) return Failed("audio encoder", rc);
  track.stream = Ff().avformat_new_stream(format, nullptr);
  if (track.stream == nullptr) return absl::ResourceExhaustedError("MP4: no memory for the audio stream");
  track.stream->time_base = c->time_base;
  if ((rc = Ff().avcodec_parameters_from_context(track.stream->codecpar, c)) < 0) return Failed("audio stream", rc);
  return track;
}

// Every sample, in frames of the encoder's size (the last one shorter).
// Quantised to 16 bits first, then to the encoder's float planes (x / 32768),
// as the pipeline's s16 frame goes through FFmpeg's resampler.
absl::Status WriteAudio(AVFormatContext* format, AudioTrack& track, const Mp4Audio& audio) {
  AVCodecContext* c = track.codec.get();
  Frame frame(Ff().av_frame_alloc());
  Packet packet(Ff().av_packet_alloc());
  if (!frame || !packet) return absl::ResourceExhaustedError("MP4: no memory for the audio frames");
  const int64_t frame_size = c->frame_size > 0 ? c->frame_size : 1024;
  frame->format = c->sample_fmt;
  frame->sample_rate = c->sample_rate;
  frame->nb_samples = static_cast<int>(frame_size);
  int rc = Ff().av_channel_layout_copy(&frame->ch_layout, &c->ch_layout);
  if (rc < 0) return Failed("audio frame", rc);
  if ((rc = Ff().av_frame_get_buffer(frame.get(), 0)) < 0) return Failed("audio frame", rc);
  const auto drain = [&]() -> absl::Status {
    while (true) {
      const int r = Ff().avcodec_receive_packet(c, packet.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return absl::OkStatus();
      if (r < 0) return Failed("audio encoding", r);
      Ff().av_packet_rescale_ts(packet.get(), c->time_base, track.stream->time_base);
      packet->stream_index = track.stream->index;
      const int w = Ff().av_interleaved_write_frame(format, packet.get());
      if (w < 0) return Failed("writing audio", w);
    }
  };
  for (int64_t start = 0; start < audio.frames; start += frame_size) {
    const int64_t n = std::min(frame_size, audio.frames - start);
    if ((rc = Ff().av_frame_make_writable(frame.get())) < 0) return Failed("audio frame", rc);
    frame->nb_samples = static_cast<int>(n);
    for (int ch = 0; ch < 2; ++ch) {
      auto* plane = reinterpret_cast<float*>(frame->data[ch]);
      const int from = std::min(ch, audio.channels - 1);
      for (int64_t i = 0; i < n; ++i) {
        const float sample = audio.samples[(start + i) * audio.channels + from];
        const float x = std::isfinite(sample) ? std::clamp(sample, -1.0f, 1.0f) : 0.0f;
        plane[i] = static_cast<float>(static_cast<int16_t>(x * 32767.0f)) / 32768.0f;
      }
    }
    frame->pts = start;
    if ((rc = Ff().avcodec_send_frame(c, frame.get())) < 0) return Failed("audio encoding", rc);
    RETURN_IF_ERROR(drain());
  }
  if ((rc = Ff().avcodec_send_frame(c, nullptr)) < 0) return Failed("audio flushing", rc);
  return drain();
}

}  // namespace

absl::StatusOr<std::string> EncodeMp4(int width, int height, int frames, const uint8_t* rgb,
                                      const Mp4Options& options) {
  if (!LoadFfmpeg().ok()) return LoadFfmpeg().status();
  if (width <= 0 || height <= 0 || width % 2 != 0 || height % 2 != 0 || width > 16384 || height > 16384) {
    return absl::InvalidArgumentError(
        absl::StrCat("MP4 (yuv420p) needs even sizes up to 16384; the video is ", width, "x", height));
  }
  if (frames < 1) return absl::InvalidArgumentError("an MP4 needs at least one frame");
  if (options.fps < 1 || options.fps > 240) {
    return absl::InvalidArgumentError(absl::StrCat("fps must be 1..240, got ", options.fps));
  }
  if (options.audio) RETURN_IF_ERROR(CheckAudio(*options.audio));
  const AVCodec* h264 = Ff().avcodec_find_encoder_by_name("libx264");
  if (h264 == nullptr) return absl::UnavailableError("this FFmpeg has no libx264 H.264 encoder");

  MemoryFile file;
  AVFormatContext* raw_format = nullptr;
  int rc = Ff().avformat_alloc_output_context2(&raw_format, nullptr, "mp4", nullptr);
  if (rc < 0 || raw_format == nullptr) return Failed("muxer", rc);
  std::unique_ptr<AVFormatContext, void (*)(AVFormatContext*)> format(raw_format, Ff().avformat_free_context);
  Io io = MakeIo(&file, true);
  if (!io) return absl::ResourceExhaustedError("MP4: no memory for the output buffer");
  format->pb = io.get();
  format->flags |= AVFMT_FLAG_CUSTOM_IO;
  // Reproducible files: no encoder version string or creation time.
  format->flags |= AVFMT_FLAG_BITEXACT;

  Codec codec(Ff().avcodec_alloc_context3(h264));
  if (!codec) return absl::ResourceExhaustedError("MP4: no memory for the encoder");
  codec->width = width;
  codec->height = height;
  codec->pix_fmt = AV_PIX_FMT_YUV420P;
  codec->time_base = AVRational{1, options.fps};
  codec->framerate = AVRational{options.fps, 1};
  codec->gop_size = options.fps;
  // x264's own threads (its default); the veryfast preset keeps encoding
  // small next to the decode. The files are valid but not bit-reproducible
  // in the worker (docs/OPERATIONS.md, "Known gaps").
  codec->flags |= AV_CODEC_FLAG_BITEXACT;
  if (format->oformat->flags & AVFMT_GLOBALHEADER) codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  Ff().av_opt_set(codec->priv_data, "preset", "veryfast", 0);
  Ff().av_opt_set_int(codec->priv_data, "crf", options.crf, 0);
  if ((rc = Ff().avcodec_open2(codec.get(), h264, nullptr)) < 0) return Failed("encoder", rc);

  AVStream* stream = Ff().avformat_new_stream(format.get(), nullptr);
  if (stream == nullptr) return absl::ResourceExhaustedError("MP4: no memory for the stream");
  stream->time_base = codec->time_base;
  stream->avg_frame_rate = codec->framerate;
  if ((rc = Ff().avcodec_parameters_from_context(stream->codecpar, codec.get())) < 0) return Failed("stream", rc);
  std::optional<AudioTrack> audio;
  if (options.audio) {
    ASSIGN_OR_RETURN(AudioTrack track, OpenAudioTrack(format.get(), *options.audio));
    audio = std::move(track);
  }
  if ((rc = Ff().avformat_write_header(format.get(), nullptr)) < 0) return Failed("header", rc);

  // Bit-exact: swscale otherwise picks SIMD paths by the buffers' alignment,
  // which round differently, and the same frames made different files.
  Sws sws(Ff().sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, AV_PIX_FMT_YUV420P, kSwsFlags, nullptr,
                              nullptr, nullptr));
  Frame frame(Ff().av_frame_alloc());
  Packet packet(Ff().av_packet_alloc());
  if (!sws || !frame || !packet) return absl::ResourceExhaustedError("MP4: no memory for the frames");
  frame->format = AV_PIX_FMT_YUV420P;
  frame->width = width;
  frame->height = height;
  if ((rc = Ff().av_frame_get_buffer(frame.get(), 0)) < 0) return Failed("frame", rc);

  const auto drain = [&]() -> absl::Status {
    while (true) {
      const int r = Ff().avcodec_receive_packet(codec.get(), packet.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return absl::OkStatus();
      if (r < 0) return Failed("encoding", r);
      // One frame each: the last frame's duration then counts in the file's.
      if (packet->duration == 0) packet->duration = 1;
      Ff().av_packet_rescale_ts(packet.get(), codec->time_base, stream->time_base);
      packet->stream_index = stream->index;
      const int w = Ff().av_interleaved_write_frame(format.get(), packet.get());
      if (w < 0) return Failed("writing", w);
    }
  };
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  const size_t frame_bytes = row_bytes * static_cast<size_t>(height);
  // swscale's SIMD may read past the end of a row and of the picture: each
  // frame is copied into a zero-padded buffer with a 64-byte stride, so
  // nothing outside the frames is ever read.
  const size_t stride = (row_bytes + 63) / 64 * 64;
  std::vector<uint8_t> padded(stride * (static_cast<size_t>(height) + 2), 0);
  for (int t = 0; t < frames; ++t) {
    if ((rc = Ff().av_frame_make_writable(frame.get())) < 0) return Failed("frame", rc);
    for (int y = 0; y < height; ++y) {
      std::memcpy(padded.data() + y * stride, rgb + t * frame_bytes + y * row_bytes, row_bytes);
    }
    const uint8_t* src[1] = {padded.data()};
    const int src_stride[1] = {static_cast<int>(stride)};
    Ff().sws_scale(sws.get(), src, src_stride, 0, height, frame->data, frame->linesize);
    frame->pts = t;
    if ((rc = Ff().avcodec_send_frame(codec.get(), frame.get())) < 0) return Failed("encoding", rc);
    RETURN_IF_ERROR(drain());
  }
  if ((rc = Ff().avcodec_send_frame(codec.get(), nullptr)) < 0) return Failed("flushing", rc);
  RETURN_IF_ERROR(drain());
  if (audio) RETURN_IF_ERROR(WriteAudio(format.get(), *audio, *options.audio));
  if ((rc = Ff().av_write_trailer(format.get())) < 0) return Failed("trailer", rc);
  Ff().avio_flush(io.get());
  return std::move(file.data);
}

absl::StatusOr<DecodedVideo> DecodeMp4(const std::string& bytes, size_t max_bytes, int64_t max_frame_pixels) {
  if (!LoadFfmpeg().ok()) return LoadFfmpeg().status();
  MemoryFile file;
  file.data = bytes;
  Io io = MakeIo(&file, false);
  if (!io) return absl::ResourceExhaustedError("MP4: no memory for the input buffer");
  AVFormatContext* raw_format = Ff().avformat_alloc_context();
  if (raw_format == nullptr) return absl::ResourceExhaustedError("MP4: no memory for the demuxer");
  raw_format->pb = io.get();
  raw_format->flags |= AVFMT_FLAG_CUSTOM_IO;
  // The MP4 demuxer only (no probing for other formats in a client's bytes).
  int rc = Ff().avformat_open_input(&raw_format, nullptr, Ff().av_find_input_format("mp4"), nullptr);
  if (rc < 0) return absl::InvalidArgumentError(absl::StrCat("not a readable MP4: ", AvError(rc)));
  std::unique_ptr<AVFormatContext*, void (*)(AVFormatContext**)> format(&raw_format, Ff().avformat_close_input);
  if ((rc = Ff().avformat_find_stream_info(raw_format, nullptr)) < 0) return Unreadable("stream info", rc);
  const int index = Ff().av_find_best_stream(raw_format, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (index < 0) return absl::InvalidArgumentError("the MP4 has no video stream");
  AVStream* stream = raw_format->streams[index];
  DecodedVideo video;
  // The audio track, described from the container (not decoded).
  if (const int a = Ff().av_find_best_stream(raw_format, AVMEDIA_TYPE_AUDIO, -1, -1, nullptr, 0); a >= 0) {
    const AVStream* audio = raw_format->streams[a];
    video.audio_channels = audio->codecpar->ch_layout.nb_channels;
    video.audio_sample_rate = audio->codecpar->sample_rate;
    if (audio->duration > 0 && audio->time_base.den > 0) {
      video.audio_seconds = static_cast<double>(audio->duration) * audio->time_base.num / audio->time_base.den;
    }
  }
  const AVCodec* decoder = Ff().avcodec_find_decoder(stream->codecpar->codec_id);
  if (decoder == nullptr) return absl::UnavailableError("no decoder for the MP4's video codec");
  Codec codec(Ff().avcodec_alloc_context3(decoder));
  if (!codec) return absl::ResourceExhaustedError("MP4: no memory for the decoder");
  if ((rc = Ff().avcodec_parameters_to_context(codec.get(), stream->codecpar)) < 0) return Unreadable("decoder", rc);
  if (max_frame_pixels > 0) codec->max_pixels = max_frame_pixels;
  if ((rc = Ff().avcodec_open2(codec.get(), decoder, nullptr)) < 0) return Unreadable("decoder", rc);

  video.width = codec->width;
  video.height = codec->height;
  if (video.width < 1 || video.height < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the MP4's video is ", video.width, "x", video.height));
  }
  const size_t frame_bytes = static_cast<size_t>(video.width) * static_cast<size_t>(video.height) * 3;
  if (frame_bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the MP4's ", video.width, "x", video.height,
                                                   " frames are larger than ", max_bytes >> 20, " MiB each"));
  }
  const AVPixelFormat pixel_format = codec->pix_fmt;
  // swscale aborts the process on a format it cannot read (or none).
  if (pixel_format == AV_PIX_FMT_NONE || Ff().sws_isSupportedInput(pixel_format) <= 0) {
    return absl::InvalidArgumentError("the MP4's video has a pixel format that cannot be converted to RGB");
  }
  video.fps = av_q2d(stream->avg_frame_rate);
  Sws sws(Ff().sws_getContext(codec->width, codec->height, codec->pix_fmt, codec->width, codec->height,
                              AV_PIX_FMT_RGB24, kSwsFlags, nullptr, nullptr, nullptr));
  Frame frame(Ff().av_frame_alloc());
  Packet packet(Ff().av_packet_alloc());
  if (!sws || !frame || !packet) return absl::ResourceExhaustedError("MP4: no memory for the frames");
  const auto take = [&]() -> absl::Status {
    while (true) {
      const int r = Ff().avcodec_receive_frame(codec.get(), frame.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return absl::OkStatus();
      if (r < 0) return Unreadable("decoding", r);
      // A stream may change size or format mid-way; the scaler is the first's.
      if (frame->width != video.width || frame->height != video.height || frame->format != pixel_format) {
        return absl::InvalidArgumentError(absl::StrCat("frame ", video.frames.size(), " of the MP4 is ", frame->width,
                                                       "x", frame->height, ", its first ", video.width, "x",
                                                       video.height, " (or another pixel format)"));
      }
      if (frame_bytes > max_bytes / (video.frames.size() + 1)) {
        return absl::InvalidArgumentError(absl::StrCat("the MP4 decodes to more than ", max_bytes >> 20,
                                                       " MiB of pixels (", video.frames.size() + 1, " frames of ",
                                                       video.width, "x", video.height, ")"));
      }
      std::vector<uint8_t> rgb(frame_bytes);
      uint8_t* dst[1] = {rgb.data()};
      const int dst_stride[1] = {video.width * 3};
      Ff().sws_scale(sws.get(), frame->data, frame->linesize, 0, video.height, dst, dst_stride);
      video.frames.push_back(std::move(rgb));
    }
  };
  while (Ff().av_read_frame(raw_format, packet.get()) >= 0) {
    if (packet->stream_index == index) {
      rc = Ff().avcodec_send_packet(codec.get(), packet.get());
      Ff().av_packet_unref(packet.get());
      if (rc < 0) return Unreadable("decoding", rc);
      RETURN_IF_ERROR(take());
    } else {
      Ff().av_packet_unref(packet.get());
    }
  }
  if ((rc = Ff().avcodec_send_packet(codec.get(), nullptr)) < 0) return Unreadable("flushing", rc);
  RETURN_IF_ERROR(take());
  return video;
}

}  // namespace vaedecode::formats
