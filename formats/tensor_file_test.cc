#include "formats/tensor_file.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "formats/npy.h"
#include "formats/png.h"
#include "formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vaedecode::formats {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

at::Tensor Ramp(std::vector<int64_t> shape, at::ScalarType type = at::kFloat) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return (at::arange(n, at::kDouble) * 0.37 - 3.1).reshape(shape).to(type);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ScalarTypeTest, ConversionsRoundTrip) {
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
                      DType::kI8, DType::kU64, DType::kU32, DType::kU16, DType::kU8, DType::kBool}) {
    absl::StatusOr<at::ScalarType> type = ToScalarType(dtype);
    ASSERT_TRUE(type.ok()) << type.status();
    EXPECT_EQ(c10::elementSize(*type), DTypeSize(dtype));
    absl::StatusOr<DType> back = FromScalarType(*type);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, dtype);
  }
  EXPECT_FALSE(FromScalarType(at::kComplexFloat).ok());
}

TEST(TensorFileTest, RoundTripBothFormats) {
  for (const char* ext : {".safetensors", ".npy"}) {
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      if (type == at::kBFloat16 && std::string(ext) == ".npy") continue;
      const at::Tensor t = Ramp({1, 4, 3, 5}, type);
      const std::string path = TempPath(std::string("rt") + ext);
      ASSERT_TRUE(WriteTensorFile(path, "latent", t).ok()) << ext << " " << type;
      absl::StatusOr<at::Tensor> read = ReadTensorFile(path);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->scalar_type(), type);
      EXPECT_EQ(read->sizes(), t.sizes());
      EXPECT_TRUE(read->is_contiguous());
      EXPECT_TRUE(at::equal(*read, t)) << ext << " " << type;
    }
  }
}

TEST(TensorFileTest, ZeroDimAndFiveDim) {
  const at::Tensor scalar = at::full({}, 2.5, at::kFloat);
  const at::Tensor video = Ramp({1, 2, 3, 2, 4});
  for (const char* ext : {".safetensors", ".npy"}) {
    const std::string path = TempPath(std::string("shapes") + ext);
    for (const at::Tensor& t : {scalar, video}) {
      ASSERT_TRUE(WriteTensorFile(path, "x", t).ok());
      absl::StatusOr<at::Tensor> read = ReadTensorFile(path);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->sizes(), t.sizes());
      EXPECT_TRUE(at::equal(*read, t));
    }
  }
}

TEST(TensorFileTest, NonContiguousInputIsWrittenInLogicalOrder) {
  const at::Tensor t = Ramp({3, 4}).t();  // [4, 3], not contiguous.
  ASSERT_FALSE(t.is_contiguous());
  for (const char* ext : {".safetensors", ".npy"}) {
    const std::string path = TempPath(std::string("transposed") + ext);
    ASSERT_TRUE(WriteTensorFile(path, "latent", t).ok());
    absl::StatusOr<at::Tensor> read = ReadTensorFile(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(at::equal(*read, t));
  }
}

TEST(TensorFileTest, SafetensorsNameIsWritten) {
  const std::string path = TempPath("named.safetensors");
  ASSERT_TRUE(WriteTensorFile(path, "sample", Ramp({2, 2})).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 1u);
  EXPECT_EQ((*file)->tensors()[0].name, "sample");
}

TEST(TensorFileTest, NamedTensorSelection) {
  const at::Tensor latent = Ramp({1, 4, 2, 2});
  const at::Tensor other = Ramp({3}).neg();
  const std::string path = TempPath("two.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  path, {{"other", DType::kF32, {3}, static_cast<const uint8_t*>(other.data_ptr()), 12},
                         {"latent", DType::kF32, {1, 4, 2, 2}, static_cast<const uint8_t*>(latent.data_ptr()), 64}})
                  .ok());
  absl::StatusOr<at::Tensor> read = ReadTensorFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(at::equal(*read, latent));
  read = ReadTensorFile(path, "other");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(at::equal(*read, other));

  read = ReadTensorFile(path, "sample");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(read.status()), HasSubstr(path));
  EXPECT_THAT(Message(read.status()), HasSubstr("none is named 'sample': 'other', 'latent'"));

  // A single tensor is taken whatever its name.
  const std::string single = TempPath("single.safetensors");
  ASSERT_TRUE(WriteTensorFile(single, "whatever", latent).ok());
  read = ReadTensorFile(single, "latent");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(at::equal(*read, latent));
}

TEST(TensorFileTest, NonFloatingTensorsAreRejected) {
  const std::string st = TempPath("int.safetensors");
  ASSERT_TRUE(WriteTensorFile(st, "latent", at::arange(4, at::kLong)).ok());
  absl::StatusOr<at::Tensor> read = ReadTensorFile(st);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(Message(read.status()), HasSubstr("latent must be a floating tensor, got I64"));
  EXPECT_THAT(Message(read.status()), HasSubstr(st));

  const std::string npy = TempPath("int.npy");
  ASSERT_TRUE(WriteTensorFile(npy, "latent", at::arange(4, at::kByte)).ok());
  read = ReadTensorFile(npy);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(Message(read.status()), HasSubstr("latent must be a floating tensor, got U8"));
}

TEST(TensorFileTest, ExtensionErrors) {
  const at::Tensor t = Ramp({2});
  absl::Status s = WriteTensorFile(TempPath("x.pt"), "latent", t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("unknown tensor file extension"));
  EXPECT_EQ(ReadTensorFile(TempPath("x.pt")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTensorFile(TempPath("missing.safetensors")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadTensorFile(TempPath("missing.npy")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(WriteTensorFile(TempPath("bf16.npy"), "latent", Ramp({2}, at::kBFloat16))),
              HasSubstr("BF16 has no NumPy dtype"));
  EXPECT_FALSE(WriteTensorFile(TempPath("undefined.npy"), "latent", at::Tensor()).ok());
  EXPECT_FALSE(WriteTensorFile(TempPath("c.npy"), "latent", at::zeros({2}, at::kComplexFloat)).ok());
}

// Expected values from diffusers' formula run in NumPy/torch 1.13 on the
// float32 values of kInputs: (torch.tensor(x, dtype=dt) / 2 +
// 0.5).float().clamp(0, 1).numpy() * 255 -> round -> uint8.
const std::vector<double> kInputs = {-1.,  0.,      1.,     0.3,  -2., 2.,    std::nan(""), -0.99,
                                     -0.5, -0.0039, 0.0039, 0.25, 0.7, 0.999, 1. / 255 - 1, 3. / 255 - 1};
const std::vector<uint8_t> kFloatPixels = {0, 128, 255, 166, 0, 255, 0, 1, 64, 127, 128, 159, 217, 255, 0, 1};

std::vector<uint8_t> GrayRow(at::ScalarType type) {
  at::Tensor x = at::tensor(kInputs, at::kDouble).to(at::kFloat).to(type).reshape({1, 1, 1, 16});
  const std::string path = TempPath("gray.png");
  absl::StatusOr<std::vector<std::string>> written = WritePngImages(path, x);
  EXPECT_TRUE(written.ok()) << written.status();
  absl::StatusOr<PngImage> image = ReadPng(path);
  EXPECT_TRUE(image.ok()) << image.status();
  if (!image.ok()) return {};
  EXPECT_EQ(image->channels, 1);
  EXPECT_EQ(image->width, 16);
  EXPECT_EQ(image->height, 1);
  return image->pixels;
}

TEST(WritePngImagesTest, PixelFormulaMatchesDiffusers) {
  EXPECT_EQ(GrayRow(at::kFloat), kFloatPixels);
  EXPECT_EQ(GrayRow(at::kDouble), kFloatPixels);
  EXPECT_EQ(GrayRow(at::kHalf), kFloatPixels);
  // In bfloat16, 0.3 / 2 + 0.5 rounds to 0.6484375, and 0.6484375 * 255 =
  // 165.35.
  std::vector<uint8_t> bf16 = kFloatPixels;
  bf16[3] = 165;
  EXPECT_EQ(GrayRow(at::kBFloat16), bf16);
}

TEST(WritePngImagesTest, KnownValues) {
  at::Tensor x = at::tensor({-1.f, 1.f, 0.f}, at::kFloat).reshape({1, 1, 1, 3});
  const std::string path = TempPath("known.png");
  ASSERT_TRUE(WritePngImages(path, x).ok());
  absl::StatusOr<PngImage> image = ReadPng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_THAT(image->pixels, ElementsAre(0, 255, 128));
}

TEST(WritePngImagesTest, SingleImageIsWrittenToPathAsRgbHwc) {
  // [1, 3, 2, 2]: channel c at pixel (y, x) is -1 + 0.25 * (4c + 2y + x).
  at::Tensor x = (at::arange(12, at::kFloat) * 0.25 - 1).reshape({1, 3, 2, 2});
  const std::string path = TempPath("single.png");
  absl::StatusOr<std::vector<std::string>> written = WritePngImages(path, x);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, ElementsAre(path));
  absl::StatusOr<PngImage> image = ReadPng(path);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->channels, 3);
  ASSERT_EQ(image->pixels.size(), 12u);
  // Pixel (0, 1): channels 1, 5, 9 -> -0.75, 0.25, 1.25.
  EXPECT_EQ(image->pixels[3], 32);   // round(0.125 * 255) = round(31.875)
  EXPECT_EQ(image->pixels[4], 159);  // round(0.625 * 255) = round(159.375)
  EXPECT_EQ(image->pixels[5], 255);  // clamped
}

TEST(WritePngImagesTest, BatchNaming) {
  at::Tensor x = at::stack({at::full({4, 3, 5}, -1.0), at::full({4, 3, 5}, 1.0)});  // RGBA
  const std::string path = TempPath("batch.png");
  absl::StatusOr<std::vector<std::string>> written = WritePngImages(path, x);
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string stem = TempPath("batch");
  EXPECT_THAT(*written, ElementsAre(stem + "_0.png", stem + "_1.png"));
  absl::StatusOr<PngImage> first = ReadPng(stem + "_0.png");
  absl::StatusOr<PngImage> second = ReadPng(stem + "_1.png");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->channels, 4);
  EXPECT_EQ(first->width, 5);
  EXPECT_EQ(first->height, 3);
  EXPECT_EQ(first->pixels, std::vector<uint8_t>(60, 0));
  EXPECT_EQ(second->pixels, std::vector<uint8_t>(60, 255));
}

TEST(WritePngImagesTest, VideoNaming) {
  // [1, 3, T=3, 2, 2], frame t filled with t - 1.
  at::Tensor frames = (at::arange(3, at::kFloat) - 1).reshape({1, 1, 3, 1, 1}).expand({1, 3, 3, 2, 2});
  const std::string path = TempPath("video.png");
  absl::StatusOr<std::vector<std::string>> written = WritePngImages(path, frames);
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string stem = TempPath("video");
  EXPECT_THAT(*written, ElementsAre(stem + "_f000.png", stem + "_f001.png", stem + "_f002.png"));
  const uint8_t expected[3] = {0, 128, 255};
  for (int t = 0; t < 3; ++t) {
    absl::StatusOr<PngImage> image = ReadPng((*written)[t]);
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->pixels, std::vector<uint8_t>(12, expected[t])) << t;
  }

  // Batch 2, T = 2; a path without ".png" keeps its whole name as the stem.
  at::Tensor batch = at::zeros({2, 1, 2, 3, 3}, at::kHalf);
  const std::string out = TempPath("clip");
  written = WritePngImages(out, batch);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written,
              ElementsAre(out + "_0_f000.png", out + "_0_f001.png", out + "_1_f000.png", out + "_1_f001.png"));
}

TEST(WritePngImagesTest, RejectsBadSamples) {
  const std::string path = TempPath("bad.png");
  EXPECT_THAT(Message(WritePngImages(path, at::zeros({3, 4, 4})).status()), HasSubstr("NCHW or NCTHW"));
  EXPECT_THAT(Message(WritePngImages(path, at::zeros({1, 2, 4, 4})).status()), HasSubstr("1, 3 or 4 channels, got 2"));
  EXPECT_THAT(Message(WritePngImages(path, at::zeros({1, 3, 4, 4}, at::kByte)).status()), HasSubstr("floating"));
  EXPECT_THAT(Message(WritePngImages(path, at::zeros({0, 3, 4, 4})).status()), HasSubstr("empty"));
  EXPECT_FALSE(WritePngImages(path, at::Tensor()).ok());
  EXPECT_FALSE(WritePngImages(TempPath("no/such/dir/x.png"), at::zeros({1, 3, 4, 4})).ok());
}

}  // namespace
}  // namespace vaedecode::formats
