#include "formats/png.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vaedecode::formats {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::vector<uint8_t> Pattern(int width, int height, int channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * channels);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return pixels;
}

TEST(PngTest, WriteThenReadEveryChannelCount) {
  for (int channels : {1, 3, 4}) {
    const int width = 13;  // Odd and non-square on purpose.
    const int height = 7;
    const std::vector<uint8_t> pixels = Pattern(width, height, channels);
    const std::string path = TempPath("c" + std::to_string(channels) + ".png");
    ASSERT_TRUE(WritePng(path, width, height, channels, pixels.data()).ok());
    absl::StatusOr<PngImage> image = ReadPng(path);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, width);
    EXPECT_EQ(image->height, height);
    EXPECT_EQ(image->channels, channels);
    EXPECT_EQ(image->pixels, pixels);
  }
}

TEST(PngTest, OnePixel) {
  const uint8_t rgba[4] = {0, 128, 255, 7};
  const std::string path = TempPath("one.png");
  ASSERT_TRUE(WritePng(path, 1, 1, 4, rgba).ok());
  absl::StatusOr<PngImage> image = ReadPng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->pixels, std::vector<uint8_t>(rgba, rgba + 4));
}

TEST(PngTest, WriteRejectsBadArguments) {
  const uint8_t pixels[16] = {};
  const std::string path = TempPath("bad.png");
  EXPECT_THAT(std::string(WritePng(path, 2, 2, 2, pixels).message()), HasSubstr("1, 3 or 4 channels"));
  EXPECT_THAT(std::string(WritePng(path, 0, 2, 3, pixels).message()), HasSubstr("invalid PNG size"));
  EXPECT_THAT(std::string(WritePng(path, 2, -1, 3, pixels).message()), HasSubstr("invalid PNG size"));
  EXPECT_THAT(std::string(WritePng(path, 2, 2, 3, nullptr).message()), HasSubstr("null"));
  EXPECT_FALSE(WritePng(TempPath("no/such/dir/x.png"), 2, 2, 1, pixels).ok());
}

TEST(PngTest, LibpngErrorsBecomeStatus) {
  // Larger than libpng's default user limit of 1,000,000 columns: libpng
  // reports the error through its error callback, which must not abort.
  std::vector<uint8_t> row(2'000'000, 0);
  absl::Status s = WritePng(TempPath("wide.png"), 2'000'000, 1, 1, row.data());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("encoding PNG failed"));
}

TEST(PngTest, ReadRejectsBadFiles) {
  EXPECT_EQ(ReadPng(TempPath("missing.png")).status().code(), absl::StatusCode::kNotFound);
  const std::string not_png = TempPath("not.png");
  std::ofstream(not_png) << "hello, this is not a png";
  EXPECT_THAT(std::string(ReadPng(not_png).status().message()), HasSubstr("not a PNG file"));

  // A valid PNG cut short: libpng's error path must free and report.
  const std::vector<uint8_t> pixels = Pattern(64, 64, 3);
  const std::string good = TempPath("good.png");
  ASSERT_TRUE(WritePng(good, 64, 64, 3, pixels.data()).ok());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t cut : {size_t{8}, size_t{20}, size_t{40}, bytes.size() / 2, bytes.size() - 13}) {
    const std::string truncated = TempPath("truncated.png");
    std::ofstream(truncated, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    absl::StatusOr<PngImage> image = ReadPng(truncated);
    EXPECT_FALSE(image.ok()) << "cut at " << cut;
    EXPECT_THAT(std::string(image.status().message()), HasSubstr(truncated));
  }
}

}  // namespace
}  // namespace vaedecode::formats

namespace vaedecode::formats {
namespace {

TEST(PngMemory, EncodeThenDecodeRoundTrips) {
  std::vector<uint8_t> pixels(5 * 3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  absl::StatusOr<std::string> bytes = EncodePng(5, 3, 4, pixels.data());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<PngImage> image = DecodePng(*bytes);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->width, 5);
  EXPECT_EQ(image->height, 3);
  EXPECT_EQ(image->channels, 4);
  EXPECT_EQ(image->pixels, pixels);
  EXPECT_FALSE(DecodePng("not a png").ok());
  EXPECT_FALSE(DecodePng("").ok());
}

TEST(PngMemory, CompressionLevelsChangeTheSizeNotThePixels) {
  // A smooth gradient: deflate shrinks it at 9 and stores it at 0.
  std::vector<uint8_t> pixels(64 * 64 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i / 3) % 64);
  absl::StatusOr<std::string> stored = EncodePng(64, 64, 3, pixels.data(), 0);
  absl::StatusOr<std::string> smallest = EncodePng(64, 64, 3, pixels.data(), 9);
  ASSERT_TRUE(stored.ok() && smallest.ok());
  EXPECT_GT(stored->size(), pixels.size());  // stored blocks: the pixels and their framing
  EXPECT_LT(smallest->size(), stored->size() / 4);
  for (const std::string* bytes : {&*stored, &*smallest}) {
    absl::StatusOr<PngImage> image = DecodePng(*bytes);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->pixels, pixels);
  }
  EXPECT_EQ(EncodePng(64, 64, 3, pixels.data(), 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodePng(64, 64, 3, pixels.data(), -1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::formats
