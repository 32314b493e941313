#include "rpc/output_assembler.h"

#include <gtest/gtest.h>

#include <cstring>

namespace vaedecode::rpc {
namespace {

v1::DecodeResponse Header(std::vector<int64_t> shape, v1::OutputFormat format) {
  v1::DecodeResponse m;
  for (int64_t d : shape) m.mutable_header()->add_shape(d);
  m.mutable_header()->set_output_format(format);
  return m;
}

v1::DecodeResponse Chunk(int64_t b, int64_t t, int64_t r0, int64_t r1, std::string data) {
  v1::DecodeResponse m;
  v1::Chunk* c = m.mutable_chunk();
  c->set_batch_index(b);
  c->set_frame(t);
  c->set_row_begin(r0);
  c->set_row_end(r1);
  c->set_data(std::move(data));
  return m;
}

v1::DecodeResponse Trailer() {
  v1::DecodeResponse m;
  m.mutable_trailer()->set_collectives(1);
  return m;
}

// A uint8 "image" [B, C, H, W] in NCHW whose value names its coordinates.
uint8_t Value(int b, int c, int y, int x) { return static_cast<uint8_t>(b * 64 + c * 16 + y * 4 + x); }

TEST(OutputAssemblerTest, ChannelFirstRowBandsLandInPlace) {
  // FLOAT16 elements (2 bytes) of [B=2, C=2, H=4, W=3]; encode Value in the low byte.
  OutputAssembler a;
  ASSERT_TRUE(a.Add(Header({2, 2, 4, 3}, v1::OUTPUT_FLOAT16)).ok());
  for (int b = 0; b < 2; ++b) {
    for (auto [r0, r1] : {std::pair<int, int>{0, 3}, {3, 4}}) {
      std::string data;
      for (int c = 0; c < 2; ++c)
        for (int y = r0; y < r1; ++y)
          for (int x = 0; x < 3; ++x) data += std::string{static_cast<char>(Value(b, c, y, x)), 0};
      ASSERT_TRUE(a.Add(Chunk(b, 0, r0, r1, data)).ok());
    }
  }
  EXPECT_FALSE(a.Finish().ok());  // no trailer yet
  ASSERT_TRUE(a.Add(Trailer()).ok());
  ASSERT_TRUE(a.Finish().ok());
  const std::string& out = a.tensor_bytes();
  ASSERT_EQ(out.size(), 2u * 2 * 4 * 3 * 2);
  for (int b = 0; b < 2; ++b)
    for (int c = 0; c < 2; ++c)
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 3; ++x)
          EXPECT_EQ(static_cast<uint8_t>(out[(((b * 2 + c) * 4 + y) * 3 + x) * 2]), Value(b, c, y, x));
}

TEST(OutputAssemblerTest, VideoChannelsLastFrames) {
  // UINT8 [B=1, T=2, H=2, W=2, C=3].
  OutputAssembler a;
  ASSERT_TRUE(a.Add(Header({1, 2, 2, 2, 3}, v1::OUTPUT_UINT8)).ok());
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(a.Add(Chunk(0, t, 0, 2, std::string(12, static_cast<char>(t + 1)))).ok());
  ASSERT_TRUE(a.Add(Trailer()).ok());
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_EQ(a.tensor_bytes(), std::string(12, 1) + std::string(12, 2));
}

TEST(OutputAssemblerTest, RejectsBrokenStreams) {
  OutputAssembler a;
  EXPECT_FALSE(a.Add(Chunk(0, 0, 0, 1, "x")).ok());  // before the header
  ASSERT_TRUE(a.Add(Header({1, 1, 2, 2}, v1::OUTPUT_FLOAT32)).ok());
  EXPECT_FALSE(a.Add(Chunk(1, 0, 0, 1, std::string(8, 0))).ok());   // batch out of range
  EXPECT_FALSE(a.Add(Chunk(0, 0, 1, 3, std::string(16, 0))).ok());  // rows out of range
  EXPECT_FALSE(a.Add(Chunk(0, 0, 0, 1, std::string(7, 0))).ok());   // wrong size
  ASSERT_TRUE(a.Add(Chunk(0, 0, 0, 1, std::string(8, 0))).ok());
  ASSERT_TRUE(a.Add(Trailer()).ok());
  EXPECT_EQ(a.Finish().code(), absl::StatusCode::kDataLoss);  // row 1 missing
}

TEST(OutputAssemblerTest, PngPerImage) {
  OutputAssembler a;
  ASSERT_TRUE(a.Add(Header({2, 4, 4, 3}, v1::OUTPUT_PNG)).ok());
  ASSERT_TRUE(a.Add(Chunk(1, 0, 0, 4, "png1")).ok());
  ASSERT_TRUE(a.Add(Chunk(0, 0, 0, 4, "pn")).ok());
  ASSERT_TRUE(a.Add(Chunk(0, 0, 0, 4, "g0")).ok());  // a PNG split over two chunks
  EXPECT_FALSE(a.Add(Chunk(1, 0, 0, 4, "again")).ok());
  ASSERT_TRUE(a.Add(Trailer()).ok());
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_EQ(a.images(), (std::vector<std::string>{"png0", "png1"}));
}

}  // namespace
}  // namespace vaedecode::rpc
