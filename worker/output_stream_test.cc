// EmitChunks and DescribeOutput on their own, without a decode: every
// format's header and chunks, chunk limits, and the round trip through the
// response assembler every reader of a Decode stream uses.

#include "worker/output_stream.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "rpc/output_assembler.h"

namespace vaedecode::worker {
namespace {

using ::testing::HasSubstr;

// A sample in [-1, 1] with distinct values, [B, C, H, W] or [B, C, T, H, W].
at::Tensor Sample(std::vector<int64_t> shape) {
  const int64_t n = c10::multiply_integers(shape);
  return (at::arange(n, at::kFloat) / static_cast<double>(n) * 2 - 1).reshape(shape);
}

std::vector<v1::Chunk> Emit(const at::Tensor& sample, v1::OutputFormat format, int64_t max_chunk_bytes,
                            const families::PixelConvention& pixels = {}) {
  OutputEncoding encoding;
  encoding.format = format;
  encoding.pixels = pixels;
  std::vector<v1::Chunk> chunks;
  const absl::Status s = EmitChunks(sample, encoding, max_chunk_bytes, [&](v1::Chunk&& c) {
    chunks.push_back(std::move(c));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return chunks;
}

// Header + chunks + trailer through the assembler, as a client reads them.
rpc::OutputAssembler Assemble(const at::Tensor& sample, v1::OutputFormat format, int64_t max_chunk_bytes,
                              const families::PixelConvention& pixels = {}) {
  rpc::OutputAssembler out;
  v1::DecodeResponse header;
  EXPECT_TRUE(DescribeOutput(sample, format, header.mutable_header()).ok());
  EXPECT_TRUE(out.Add(header).ok());
  for (v1::Chunk& c : Emit(sample, format, max_chunk_bytes, pixels)) {
    v1::DecodeResponse m;
    *m.mutable_chunk() = std::move(c);
    const absl::Status s = out.Add(m);
    EXPECT_TRUE(s.ok()) << s;
  }
  v1::DecodeResponse trailer;
  trailer.mutable_trailer();
  EXPECT_TRUE(out.Add(trailer).ok());
  EXPECT_TRUE(out.Finish().ok()) << out.Finish();
  return out;
}

TEST(EmitChunks, TensorRowBandsWithinTheChunkLimit) {
  const at::Tensor sample = Sample({2, 3, 5, 4});  // a row of all channels: 3 x 4 floats = 48 bytes
  const std::vector<v1::Chunk> chunks = Emit(sample, v1::OUTPUT_FLOAT32, 100);
  ASSERT_EQ(chunks.size(), 6u);  // per image: rows [0,2) [2,4) [4,5)
  EXPECT_EQ(chunks[1].batch_index(), 0);
  EXPECT_EQ(chunks[1].row_begin(), 2);
  EXPECT_EQ(chunks[1].row_end(), 4);
  EXPECT_EQ(chunks[1].data().size(), 2u * 48);
  EXPECT_EQ(chunks[5].batch_index(), 1);
  // [C, rows, W] of the sample.
  const at::Tensor want = sample[1].narrow(1, 4, 1).contiguous();
  EXPECT_EQ(std::memcmp(chunks[5].data().data(), want.data_ptr(), want.nbytes()), 0);
  // A row larger than the limit still goes alone.
  EXPECT_EQ(Emit(sample, v1::OUTPUT_FLOAT32, 1).size(), 10u);
}

TEST(EmitChunks, AssemblesBackToTheSampleInEveryTensorFormat) {
  const at::Tensor sample = Sample({1, 3, 2, 7, 5});  // video: frames stream one by one
  rpc::OutputAssembler f32 = Assemble(sample, v1::OUTPUT_FLOAT32, 64);
  ASSERT_EQ(f32.tensor_bytes().size(), static_cast<size_t>(sample.nbytes()));
  EXPECT_EQ(std::memcmp(f32.tensor_bytes().data(), sample.data_ptr(), sample.nbytes()), 0);

  rpc::OutputAssembler f16 = Assemble(sample, v1::OUTPUT_FLOAT16, 64);
  EXPECT_EQ(f16.header().dtype(), v1::FLOAT16);
  const at::Tensor half = sample.to(at::kHalf);
  EXPECT_EQ(std::memcmp(f16.tensor_bytes().data(), half.data_ptr(), half.nbytes()), 0);

  rpc::OutputAssembler u8 = Assemble(sample, v1::OUTPUT_UINT8, 64);
  EXPECT_EQ(std::vector<int64_t>(u8.header().shape().begin(), u8.header().shape().end()),
            (std::vector<int64_t>{1, 2, 7, 5, 3}));  // channels last
  const at::Tensor pixels =
      ((sample / 2 + 0.5).clamp(0, 1) * 255).round().to(at::kByte).permute({0, 2, 3, 4, 1}).contiguous();
  EXPECT_EQ(std::memcmp(u8.tensor_bytes().data(), pixels.data_ptr(), pixels.nbytes()), 0);
}

TEST(EmitChunks, PixelsFollowTheModelsConvention) {
  // An ImageNet-normalised model (MiniMax-H3): its pipeline's postprocess,
  // clamp(x · std + mean, 0, 1) · 255 rounded; float outputs stay the sample.
  const families::PixelConvention imagenet{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}};
  const at::Tensor sample = Sample({1, 3, 2, 7, 5}) * 2;
  rpc::OutputAssembler u8 = Assemble(sample, v1::OUTPUT_UINT8, 64, imagenet);
  const at::Tensor mean = at::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1, 1});
  const at::Tensor std = at::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1, 1});
  const at::Tensor want =
      ((sample * std + mean).clamp(0, 1) * 255).round().to(at::kByte).permute({0, 2, 3, 4, 1}).contiguous();
  ASSERT_EQ(u8.tensor_bytes().size(), static_cast<size_t>(want.nbytes()));
  const at::Tensor got = at::from_blob(const_cast<char*>(u8.tensor_bytes().data()), want.sizes(), at::kByte);
  // (x · std + mean) · 2 − 1 then / 2 + 0.5 rounds a value on a .5 edge either way.
  EXPECT_LE((got.to(at::kInt) - want.to(at::kInt)).abs().max().item<int>(), 1);
  EXPECT_GT((got.to(at::kInt) - want.to(at::kInt)).eq(0).to(at::kFloat).mean().item<float>(), 0.99);
  rpc::OutputAssembler f32 = Assemble(sample, v1::OUTPUT_FLOAT32, 64, imagenet);
  EXPECT_EQ(std::memcmp(f32.tensor_bytes().data(), sample.data_ptr(), sample.nbytes()), 0);
}

TEST(EmitChunks, OneFilePerImageInPiecesAndOneVideoPerEntry) {
  const at::Tensor sample = Sample({2, 3, 8, 6});
  const std::vector<v1::Chunk> pieces = Emit(sample, v1::OUTPUT_PNG, 16);
  EXPECT_GT(pieces.size(), 2u);  // each PNG is split into 16-byte pieces
  rpc::OutputAssembler png = Assemble(sample, v1::OUTPUT_PNG, 16);
  ASSERT_EQ(png.images().size(), 2u);
  for (const std::string& file : png.images()) EXPECT_EQ(file.substr(1, 3), "PNG");

  const at::Tensor clip = Sample({1, 3, 3, 16, 16});
  rpc::OutputAssembler mp4 = Assemble(clip, v1::OUTPUT_MP4, 1 << 20);
  ASSERT_EQ(mp4.images().size(), 1u);
  EXPECT_EQ(mp4.images()[0].substr(4, 4), "ftyp");
}

TEST(EmitChunks, StopsWhenTheReaderIsGoneAndRefusesWhatCannotBeWritten) {
  int calls = 0;
  OutputEncoding encoding;
  const absl::Status stopped = EmitChunks(Sample({1, 3, 4, 4}), encoding, 16, [&](v1::Chunk&&) {
    ++calls;
    return false;
  });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);

  v1::Header header;
  EXPECT_THAT(std::string(DescribeOutput(Sample({1, 2, 4, 4}), v1::OUTPUT_PNG, &header).message()),
              HasSubstr("png needs 1, 3 or 4 output channels; the decoded sample has 2"));
  EXPECT_THAT(std::string(DescribeOutput(Sample({1, 3, 4, 4}), v1::OUTPUT_MP4, &header).message()),
              HasSubstr("mp4 holds video"));
}

}  // namespace
}  // namespace vaedecode::worker
