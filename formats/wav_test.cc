#include "formats/wav.h"

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vaedecode::formats {
namespace {

using ::testing::HasSubstr;

uint32_t U32(const std::string& b, size_t at) {
  return static_cast<uint8_t>(b[at]) | static_cast<uint8_t>(b[at + 1]) << 8 | static_cast<uint8_t>(b[at + 2]) << 16 |
         static_cast<uint32_t>(static_cast<uint8_t>(b[at + 3])) << 24;
}
int16_t I16(const std::string& b, size_t at) {
  return static_cast<int16_t>(static_cast<uint8_t>(b[at]) | static_cast<uint8_t>(b[at + 1]) << 8);
}

TEST(Wav, Pcm16HeaderAndClampedRoundedSamples) {
  // Two channels, two frames: (0.5, -1.5), (1.0, -0.25).
  absl::StatusOr<std::string> wav = EncodeWav({0.5f, -1.5f, 1.0f, -0.25f}, 2, 32000, WavEncoding::kPcm16);
  ASSERT_TRUE(wav.ok()) << wav.status();
  ASSERT_EQ(wav->size(), 44u + 8u);
  EXPECT_EQ(wav->substr(0, 4), "RIFF");
  EXPECT_EQ(U32(*wav, 4), 36u + 8u);
  EXPECT_EQ(wav->substr(8, 8), "WAVEfmt ");
  EXPECT_EQ(U32(*wav, 16), 16u);
  EXPECT_EQ(I16(*wav, 20), 1);       // PCM
  EXPECT_EQ(I16(*wav, 22), 2);       // channels
  EXPECT_EQ(U32(*wav, 24), 32000u);  // sample rate
  EXPECT_EQ(U32(*wav, 28), 32000u * 4);
  EXPECT_EQ(I16(*wav, 32), 4);   // block align
  EXPECT_EQ(I16(*wav, 34), 16);  // bits
  EXPECT_EQ(wav->substr(36, 4), "data");
  EXPECT_EQ(U32(*wav, 40), 8u);
  EXPECT_EQ(I16(*wav, 44), 16384);   // round(0.5 · 32767)
  EXPECT_EQ(I16(*wav, 46), -32767);  // clamped
  EXPECT_EQ(I16(*wav, 48), 32767);
  EXPECT_EQ(I16(*wav, 50), -8192);  // round(-0.25 · 32767) = -8191.75
}

TEST(Wav, Float32KeepsTheSamplesAfterAFactChunk) {
  absl::StatusOr<std::string> wav = EncodeWav({0.125f, -2.0f}, 1, 24000, WavEncoding::kFloat32);
  ASSERT_TRUE(wav.ok()) << wav.status();
  ASSERT_EQ(wav->size(), 58u + 8u);
  EXPECT_EQ(U32(*wav, 4), 50u + 8u);
  EXPECT_EQ(U32(*wav, 16), 18u);  // fmt chunk with cbSize
  EXPECT_EQ(I16(*wav, 20), 3);    // IEEE float
  EXPECT_EQ(I16(*wav, 34), 32);
  EXPECT_EQ(I16(*wav, 36), 0);  // cbSize
  EXPECT_EQ(wav->substr(38, 4), "fact");
  EXPECT_EQ(U32(*wav, 42), 4u);
  EXPECT_EQ(U32(*wav, 46), 2u);  // frames
  EXPECT_EQ(wav->substr(50, 4), "data");
  EXPECT_EQ(U32(*wav, 54), 8u);
  float second;
  std::memcpy(&second, wav->data() + 62, 4);
  EXPECT_EQ(second, -2.0f);  // not clamped
}

TEST(Wav, RefusesWhatIsNotWholeFrames) {
  EXPECT_THAT(std::string(EncodeWav({0.0f, 0.0f, 0.0f}, 2, 8000, WavEncoding::kPcm16).status().message()),
              HasSubstr("not whole frames"));
  EXPECT_FALSE(EncodeWav({}, 0, 8000, WavEncoding::kPcm16).ok());
  EXPECT_FALSE(EncodeWav({}, 1, 0, WavEncoding::kPcm16).ok());
  EXPECT_THAT(std::string(EncodeWav({}, 20000, 48000, WavEncoding::kFloat32).status().message()),
              HasSubstr("do not fit a WAV header"));
}

}  // namespace
}  // namespace vaedecode::formats
