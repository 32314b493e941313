#pragma once

// H.264 (yuv420p) MP4 writing in memory through FFmpeg's libavcodec (libx264)
// and libavformat, and reading MP4s back (tests, clients, and a client's
// clip to encode: those bytes are hostile, formats/image_bytes_fuzzer). FFmpeg
// is loaded with dlopen on first use (Debian 12's libavcodec59,
// libavformat59, libswscale6): where it is missing, both calls return
// UNAVAILABLE saying what to install. FFmpeg logs nothing; its errors come
// back as Status; nothing here throws. Thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vaedecode::formats {

// Frame rate when a request names none.
inline constexpr int kDefaultVideoFps = 16;

// The sample rates an MP4's AAC track can have (MPEG-4's sampling
// frequency table: 7350 to 96000 Hz).
bool IsAacSampleRate(int64_t rate);

// A waveform to mux beside the video: `frames` samples of `channels` (1 or
// 2) interleaved, frame-major, floats in [-1, 1] at `sample_rate`
// (IsAacSampleRate). Not owned.
struct Mp4Audio {
  const float* samples = nullptr;
  int64_t frames = 0;
  int channels = 0;
  int sample_rate = 0;
};

struct Mp4Options {
  int fps = kDefaultVideoFps;
  int crf = 18;  // x264's constant rate factor: 0 lossless .. 51 worst; 18 is visually lossless
  // An audio track, written whole after the video as diffusers'
  // encode_video writes LTX-2's: stereo AAC-LC (mono on both channels) at
  // the waveform's rate, its samples clipped to [-1, 1] and quantised to 16
  // bits first, as the pipeline's s16 frame is.
  std::optional<Mp4Audio> audio;
};

// Encodes `frames` RGB images of width x height (even sizes: 4:2:0 chroma),
// HWC row-major one after another, as an MP4 with one H.264 stream (and
// options.audio's AAC stream).
absl::StatusOr<std::string> EncodeMp4(int width, int height, int frames, const uint8_t* rgb, const Mp4Options& options);

struct DecodedVideo {
  int width = 0;
  int height = 0;
  double fps = 0;
  std::vector<std::vector<uint8_t>> frames;  // RGB HWC each
  // Its audio track as the container describes it (0 when it has none).
  int audio_channels = 0;
  int audio_sample_rate = 0;
  double audio_seconds = 0;
};

// Decodes every frame of an in-memory MP4's first video stream to RGB. A
// client's bytes: at most `max_bytes` of RGB frames (INVALID_ARGUMENT past
// it, before decoding further), every frame the size and pixel format of
// the first (INVALID_ARGUMENT otherwise), and with `max_frame_pixels` > 0 the
// decoder itself refuses larger frames (before it allocates for them).
absl::StatusOr<DecodedVideo> DecodeMp4(const std::string& bytes, size_t max_bytes = SIZE_MAX,
                                       int64_t max_frame_pixels = 0);

}  // namespace vaedecode::formats
