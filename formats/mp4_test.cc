#include "formats/mp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

namespace vaedecode::formats {
namespace {

// A smooth moving gradient: lossy H.264 keeps it within a few levels.
std::vector<uint8_t> Clip(int width, int height, int frames) {
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * 3 * frames);
  size_t i = 0;
  for (int t = 0; t < frames; ++t) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        p[i++] = static_cast<uint8_t>(60 + 2 * x + t);
        p[i++] = static_cast<uint8_t>(40 + 3 * y);
        p[i++] = static_cast<uint8_t>(100 + x + y - t);
      }
    }
  }
  return p;
}

TEST(Mp4Test, EncodesFramesThatDecodeBack) {
  const int width = 48, height = 32, frames = 9;
  const std::vector<uint8_t> clip = Clip(width, height, frames);
  Mp4Options options;
  options.fps = 12;
  absl::StatusOr<std::string> mp4 = EncodeMp4(width, height, frames, clip.data(), options);
  ASSERT_TRUE(mp4.ok()) << mp4.status();
  ASSERT_GT(mp4->size(), 8u);
  EXPECT_EQ(mp4->substr(4, 4), "ftyp");
  absl::StatusOr<DecodedVideo> video = DecodeMp4(*mp4);
  ASSERT_TRUE(video.ok()) << video.status();
  EXPECT_EQ(video->width, width);
  EXPECT_EQ(video->height, height);
  EXPECT_NEAR(video->fps, 12.0, 1e-6);
  ASSERT_EQ(video->frames.size(), static_cast<size_t>(frames));
  const size_t frame_bytes = static_cast<size_t>(width) * height * 3;
  for (int t = 0; t < frames; ++t) {
    double error = 0;
    for (size_t i = 0; i < frame_bytes; ++i) {
      error += std::abs(static_cast<int>(video->frames[t][i]) - static_cast<int>(clip[t * frame_bytes + i]));
    }
    EXPECT_LT(error / frame_bytes, 4.0) << "frame " << t;
  }
}

TEST(Mp4Test, AnAudioTrackIsMuxedWholeBesideTheVideo) {
  const int width = 32, height = 16, frames = 8, fps = 8;
  const std::vector<uint8_t> clip = Clip(width, height, frames);
  // 1.25 s of a 440 Hz tone at 24 kHz: longer than the video's second, all written.
  const int rate = 24000;
  const int64_t samples = rate * 5 / 4;
  for (const int channels : {1, 2}) {
    std::vector<float> wave(static_cast<size_t>(samples * channels));
    for (int64_t i = 0; i < samples; ++i) {
      for (int c = 0; c < channels; ++c) wave[i * channels + c] = 0.5f * std::sin(6.2831853f * 440 * i / rate + c);
    }
    Mp4Options options;
    options.fps = fps;
    options.audio = Mp4Audio{wave.data(), samples, channels, rate};
    absl::StatusOr<std::string> mp4 = EncodeMp4(width, height, frames, clip.data(), options);
    ASSERT_TRUE(mp4.ok()) << mp4.status();
    absl::StatusOr<DecodedVideo> video = DecodeMp4(*mp4);
    ASSERT_TRUE(video.ok()) << video.status();
    EXPECT_EQ(video->frames.size(), static_cast<size_t>(frames));
    EXPECT_EQ(video->audio_channels, 2);  // stereo, mono on both channels
    EXPECT_EQ(video->audio_sample_rate, rate);
    // The whole waveform (AAC frames of 1024 samples round its end up).
    EXPECT_NEAR(video->audio_seconds, 1.25, 1024.0 / rate) << channels;
  }
  // Without audio, none.
  absl::StatusOr<std::string> silent = EncodeMp4(width, height, frames, clip.data(), Mp4Options{});
  ASSERT_TRUE(silent.ok());
  EXPECT_EQ(DecodeMp4(*silent)->audio_channels, 0);
  // What AAC cannot hold is refused.
  std::vector<float> one(16, 0.0f);
  Mp4Options bad;
  bad.audio = Mp4Audio{one.data(), 4, 4, rate};
  EXPECT_EQ(EncodeMp4(width, height, frames, clip.data(), bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.audio = Mp4Audio{one.data(), 16, 1, 200000};
  EXPECT_EQ(EncodeMp4(width, height, frames, clip.data(), bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.audio = Mp4Audio{one.data(), 16, 1, 25000};  // within the range, not one of AAC's rates
  EXPECT_EQ(EncodeMp4(width, height, frames, clip.data(), bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsAacSampleRate(24000) && IsAacSampleRate(32000) && IsAacSampleRate(7350));
  EXPECT_FALSE(IsAacSampleRate(25000) || IsAacSampleRate(0));
}

TEST(Mp4Test, SameFramesSameBytes) {
  const std::vector<uint8_t> clip = Clip(16, 16, 3);
  absl::StatusOr<std::string> a = EncodeMp4(16, 16, 3, clip.data(), Mp4Options{});
  absl::StatusOr<std::string> b = EncodeMp4(16, 16, 3, clip.data(), Mp4Options{});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(Mp4Test, RefusesWhatYuv420CannotHold) {
  const std::vector<uint8_t> clip = Clip(15, 16, 1);
  EXPECT_EQ(EncodeMp4(15, 16, 1, clip.data(), Mp4Options{}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeMp4(16, 16, 0, clip.data(), Mp4Options{}).status().code(), absl::StatusCode::kInvalidArgument);
  Mp4Options fast;
  fast.fps = 1000;
  EXPECT_EQ(EncodeMp4(16, 16, 1, clip.data(), fast).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeMp4("definitely not a video").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::formats
