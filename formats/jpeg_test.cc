#include "formats/jpeg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

namespace vaedecode::formats {
namespace {

// A smooth RGB gradient: JPEG's lossy round trip stays within a few levels.
std::vector<uint8_t> Gradient(int width, int height, int channels) {
  std::vector<uint8_t> p(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        p[(static_cast<size_t>(y) * width + x) * channels + c] =
            static_cast<uint8_t>((x * 3 + y * 2 + c * 40) % 256 / 2 + 40);
      }
    }
  }
  return p;
}

double MeanAbsError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
  return sum / static_cast<double>(a.size());
}

TEST(JpegTest, RoundTripsRgbAndGrayWithinLossyError) {
  for (int channels : {1, 3}) {
    const std::vector<uint8_t> pixels = Gradient(37, 21, channels);
    absl::StatusOr<std::string> bytes = EncodeJpeg(37, 21, channels, pixels.data(), 95);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(static_cast<uint8_t>((*bytes)[0]), 0xFF);
    EXPECT_EQ(static_cast<uint8_t>((*bytes)[1]), 0xD8);
    absl::StatusOr<JpegImage> image = DecodeJpeg(*bytes);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, 37);
    EXPECT_EQ(image->height, 21);
    EXPECT_EQ(image->channels, channels);
    EXPECT_LT(MeanAbsError(image->pixels, pixels), 3.0) << channels;
  }
}

TEST(JpegTest, QualityChangesTheBytesAndIsDeterministic) {
  const std::vector<uint8_t> pixels = Gradient(64, 48, 3);
  absl::StatusOr<std::string> low = EncodeJpeg(64, 48, 3, pixels.data(), 20);
  absl::StatusOr<std::string> high = EncodeJpeg(64, 48, 3, pixels.data(), 95);
  absl::StatusOr<std::string> high_again = EncodeJpeg(64, 48, 3, pixels.data(), 95);
  ASSERT_TRUE(low.ok() && high.ok() && high_again.ok());
  EXPECT_LT(low->size(), high->size());
  EXPECT_EQ(*high, *high_again);
}

TEST(JpegTest, RefusesWhatJpegCannotHold) {
  const std::vector<uint8_t> pixels(4 * 4 * 4, 0);
  EXPECT_EQ(EncodeJpeg(4, 4, 4, pixels.data(), 75).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeJpeg(4, 4, 3, pixels.data(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeJpeg(70000, 1, 3, pixels.data(), 75).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeJpeg("not a jpeg").status().code(), absl::StatusCode::kInvalidArgument);
  // A truncated stream is reported, not fatal.
  absl::StatusOr<std::string> bytes = EncodeJpeg(4, 4, 3, pixels.data(), 75);
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<JpegImage> cut = DecodeJpeg(bytes->substr(0, 20));
  EXPECT_FALSE(cut.ok());
}

}  // namespace
}  // namespace vaedecode::formats
