// Image inputs become the tensor diffusers' VaeImageProcessor makes
// (p / 255 · 2 − 1, [1, C, H, W]); other bytes and extensions are refused by name.

#include "formats/image_input.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "formats/jpeg.h"
#include "formats/mp4.h"
#include "formats/mp4_header.h"
#include "formats/png.h"

namespace vaedecode::formats {
namespace {

TEST(ImageInput, PixelsBecomeTheProcessorsTensor) {
  // 2x3 RGB: pixel (y, x) channel c = 40·y + 10·x + c, and 0 / 255 at the ends.
  std::vector<uint8_t> pixels(2 * 3 * 3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 3; ++c) pixels[(y * 3 + x) * 3 + c] = static_cast<uint8_t>(40 * y + 10 * x + c);
  pixels[0] = 0;
  pixels.back() = 255;
  const at::Tensor t = ImageTensorFromPixels(Pixels{3, 2, 3, 1, false, pixels});
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{1, 3, 2, 3}));
  EXPECT_EQ(t[0][0][0][0].item<float>(), -1.0f);
  EXPECT_EQ(t[0][2][1][2].item<float>(), 1.0f);
  const float p = 40 * 1 + 10 * 0 + 1;  // (y 1, x 0, channel 1)
  EXPECT_EQ(t[0][1][1][0].item<float>(), 2.0f * (p / 255.0f) - 1.0f);
}

TEST(ImageInput, PngAndJpegBytesDecode) {
  std::vector<uint8_t> rgba(4 * 5 * 4, 200);
  absl::StatusOr<std::string> png = EncodePng(4, 5, 4, rgba.data());
  ASSERT_TRUE(png.ok()) << png.status();
  absl::StatusOr<at::Tensor> from_png = DecodeImageBytes(*png);
  ASSERT_TRUE(from_png.ok()) << from_png.status();
  EXPECT_EQ(from_png->sizes(), (std::vector<int64_t>{1, 4, 5, 4}));  // RGBA stays 4 channels (Qwen-Image encodes them)
  std::vector<uint8_t> rgb(8 * 8 * 3, 17);
  absl::StatusOr<std::string> jpeg = EncodeJpeg(8, 8, 3, rgb.data(), 95);
  ASSERT_TRUE(jpeg.ok()) << jpeg.status();
  absl::StatusOr<at::Tensor> from_jpeg = DecodeImageBytes(*jpeg);
  ASSERT_TRUE(from_jpeg.ok()) << from_jpeg.status();
  EXPECT_EQ(from_jpeg->sizes(), (std::vector<int64_t>{1, 3, 8, 8}));
}

// An MP4's frames as a [1, 3, T, H, W] clip, exactly what FFmpeg decodes;
// the server admitted it by the size its boxes declare, which must be that.
TEST(ImageInput, Mp4BytesDecodeToAClipOfTheDeclaredSize) {
  const int w = 16, h = 8, frames = 5;
  std::vector<uint8_t> rgb(static_cast<size_t>(frames) * h * w * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7) % 251);
  absl::StatusOr<std::string> mp4 = EncodeMp4(w, h, frames, rgb.data(), Mp4Options{});
  ASSERT_TRUE(mp4.ok()) << mp4.status();
  absl::StatusOr<Mp4VideoSize> declared = Mp4DeclaredVideoSize(*mp4);
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(declared->width, w);
  EXPECT_EQ(declared->height, h);
  EXPECT_EQ(declared->frames, frames);
  absl::StatusOr<at::Tensor> clip = DecodeImageBytes(*mp4);
  ASSERT_TRUE(clip.ok()) << clip.status();
  ASSERT_EQ(clip->sizes(), (std::vector<int64_t>{1, 3, frames, h, w}));
  absl::StatusOr<DecodedVideo> video = DecodeMp4(*mp4);
  ASSERT_TRUE(video.ok()) << video.status();
  for (int f = 0; f < frames; ++f) {
    const at::Tensor want =
        at::from_blob(video->frames[f].data(), {h, w, 3}, at::kByte).to(at::kFloat).div(255.0).mul(2).sub(1);
    EXPECT_TRUE(at::equal((*clip)[0].select(1, f).permute({1, 2, 0}), want)) << "frame " << f;
  }
  // A header that lies about the frame count is refused, naming both.
  std::string lying = *mp4;
  const size_t stsz = lying.find("stsz");
  ASSERT_NE(stsz, std::string::npos);
  lying[stsz + 4 + 8 + 3] = static_cast<char>(frames + 2);  // sample_count's low byte
  absl::StatusOr<at::Tensor> refused = DecodeImageBytes(lying);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("declares 7 frames"), std::string::npos) << refused.status();
  // Truncated inside the movie box: it no longer fits.
  const size_t moov = mp4->find("moov");
  ASSERT_NE(moov, std::string::npos);
  EXPECT_EQ(Mp4DeclaredVideoSize(mp4->substr(0, moov + 40)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ImageInput, OtherBytesAndExtensionsAreRefusedByName) {
  absl::StatusOr<at::Tensor> junk = DecodeImageBytes("{\"not\": \"an image\"}");
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(junk.status().message().find("neither PNG, JPEG nor MP4"), std::string::npos) << junk.status();
  absl::StatusOr<at::Tensor> truncated = DecodeImageBytes(std::string("\x89PNG\r\n\x1a\n", 8) + "short");
  EXPECT_FALSE(truncated.ok());
  absl::StatusOr<at::Tensor> gif = ReadImageInput("/nonexistent/picture.gif");
  EXPECT_NE(gif.status().message().find("want .png"), std::string::npos) << gif.status();
}

}  // namespace
}  // namespace vaedecode::formats
