#include "formats/npy.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// Files written by NumPy 1.24 (np.save / numpy.lib.format.write_array).
std::string TestData(const std::string& name) { return "formats/testdata/npy/" + name; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
std::vector<T> Values(const NpyArray& a) {
  std::vector<T> out(a.data.size() / sizeof(T));
  std::memcpy(out.data(), a.data.data(), out.size() * sizeof(T));
  return out;
}

// A .npy file built by hand, header unpadded.
std::string MakeNpy(int major, const std::string& header, const std::string& data, int minor = 0) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  const int length_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < length_bytes; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

std::string Header(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape +
         ", }\n";
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

void ExpectRejected(const std::string& bytes, const std::string& problem) {
  absl::StatusOr<NpyArray> a = ParseNpy(bytes, "test.npy");
  ASSERT_FALSE(a.ok()) << "accepted; expected: " << problem;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(a.status().message());
  EXPECT_THAT(message, HasSubstr("test.npy: "));
  EXPECT_THAT(message, HasSubstr(problem));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(NpyTest, ReadsNumpyFiles) {
  absl::StatusOr<NpyArray> c = ReadNpy(TestData("c_f4.npy"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dtype, DType::kF32);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<float>(*c), (std::vector<float>{-2, -0.5, 1, 2.5, 4, 5.5}));

  absl::StatusOr<NpyArray> big = ReadNpy(TestData("big_f4.npy"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->dtype, DType::kF32);
  EXPECT_EQ(Values<float>(*big), Values<float>(*c));

  absl::StatusOr<NpyArray> f = ReadNpy(TestData("fortran_f8.npy"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->dtype, DType::kF64);
  EXPECT_EQ(f->shape, (std::vector<int64_t>{2, 3, 4}));
  std::vector<double> arange(24);
  for (int i = 0; i < 24; ++i) arange[i] = i;
  EXPECT_EQ(Values<double>(*f),
            arange);  // np.arange(24).reshape(2, 3, 4) in C order.

  absl::StatusOr<NpyArray> b = ReadNpy(TestData("bool.npy"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype, DType::kBool);
  EXPECT_EQ(b->data, std::string("\1\0\1", 3));

  absl::StatusOr<NpyArray> s = ReadNpy(TestData("scalar_i8.npy"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dtype, DType::kI64);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(Values<int64_t>(*s), (std::vector<int64_t>{-7}));

  absl::StatusOr<NpyArray> v2 = ReadNpy(TestData("v2_f2.npy"));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->dtype, DType::kF16);
  EXPECT_EQ(v2->shape, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(Values<uint16_t>(*v2), (std::vector<uint16_t>{0x0000, 0x3c00, 0x4000, 0x4200}));

  absl::StatusOr<NpyArray> v3 = ReadNpy(TestData("v3_u1.npy"));
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->dtype, DType::kU8);
  EXPECT_EQ(v3->data, std::string("\0\1\2\3\4", 5));

  absl::StatusOr<NpyArray> e = ReadNpy(TestData("empty_f4.npy"));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(e->data.empty());
}

TEST(NpyTest, WriteThenReadRoundTrip) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  const std::string path = TempPath("roundtrip.npy");
  ASSERT_TRUE(WriteNpy(path, DType::kF32, {2, 3}, v.data(), 24).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes.size(), 10 + header_len + 24);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_EQ(header, Header("<f4", "(2, 3)").substr(0, header.find('}') + 1) +
                        std::string(header_len - header.find('}') - 2, ' ') + "\n");
  // Same bytes as NumPy writes for the same array (c_f4.npy holds other
  // values).
  EXPECT_EQ(header, ReadAll(TestData("c_f4.npy")).substr(10, header_len));

  absl::StatusOr<NpyArray> a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values<float>(*a), v);
}

TEST(NpyTest, RoundTripEveryDType) {
  const uint8_t raw[16] = {1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1};  // Valid bools too.
  for (DType dtype : {DType::kF64, DType::kF32, DType::kF16, DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                      DType::kU64, DType::kU32, DType::kU16, DType::kU8, DType::kBool}) {
    const size_t n = 16 / DTypeSize(dtype);
    const std::string path = TempPath("dtype.npy");
    ASSERT_TRUE(WriteNpy(path, dtype, {static_cast<int64_t>(n)}, raw, 16).ok()) << DTypeName(dtype);
    absl::StatusOr<NpyArray> a = ReadNpy(path);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->dtype, dtype);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{static_cast<int64_t>(n)}));
    EXPECT_EQ(a->data, Bytes(raw, 16));
  }
}

TEST(NpyTest, ZeroDimAndEmptyRoundTrip) {
  const double x = 3.5;
  const std::string path = TempPath("scalar.npy");
  ASSERT_TRUE(WriteNpy(path, DType::kF64, {}, &x, 8).ok());
  EXPECT_THAT(ReadAll(path), HasSubstr("'shape': ()"));
  absl::StatusOr<NpyArray> a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(Values<double>(*a), std::vector<double>{3.5});

  ASSERT_TRUE(WriteNpy(path, DType::kF32, {3, 0}, nullptr, 0).ok());
  a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 0}));
}

TEST(NpyTest, OneDimShapeIsAOneTuple) {
  const float x[5] = {};
  const std::string path = TempPath("one_d.npy");
  ASSERT_TRUE(WriteNpy(path, DType::kF32, {5}, x, 20).ok());
  EXPECT_THAT(ReadAll(path), HasSubstr("'shape': (5,)"));
}

TEST(NpyTest, WriterRejectsBadInput) {
  const float x[4] = {};
  absl::Status bf16 = WriteNpy(TempPath("bf16.npy"), DType::kBF16, {2}, x, 4);
  EXPECT_EQ(bf16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bf16.message()), HasSubstr("BF16 has no NumPy dtype"));
  EXPECT_THAT(std::string(WriteNpy(TempPath("x.npy"), DType::kF32, {3}, x, 16).message()),
              HasSubstr("does not match shape (3,)"));
  EXPECT_THAT(std::string(WriteNpy(TempPath("x.npy"), DType::kF32, {-1}, x, 16).message()), HasSubstr("invalid shape"));
  EXPECT_THAT(std::string(WriteNpy(TempPath("x.npy"), DType::kF32, {4}, nullptr, 16).message()), HasSubstr("null"));
}

TEST(NpyTest, BigEndianIsSwapped) {
  const std::string be_i8("\0\0\0\0\0\0\1\2", 8);
  absl::StatusOr<NpyArray> a = ParseNpy(MakeNpy(1, Header(">i8", "(1,)"), be_i8), "x.npy");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Values<int64_t>(*a), std::vector<int64_t>{0x0102});
  absl::StatusOr<NpyArray> u = ParseNpy(MakeNpy(1, Header(">u2", "(2,)"), "\x12\x34\xab\xcd"), "x");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(Values<uint16_t>(*u), (std::vector<uint16_t>{0x1234, 0xabcd}));
  // One-byte types have no byte order.
  absl::StatusOr<NpyArray> b = ParseNpy(MakeNpy(1, Header(">u1", "(2,)"), "\x01\x02"), "x");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data, "\x01\x02");
}

TEST(NpyTest, NativeAndNotApplicableByteOrder) {
  const float one = 1.0f;
  absl::StatusOr<NpyArray> a = ParseNpy(MakeNpy(1, Header("=f4", "()"), Bytes(&one, 4)), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Values<float>(*a), std::vector<float>{1.0f});
  EXPECT_TRUE(ParseNpy(MakeNpy(1, Header("|i1", "(1,)"), "\xff"), "x").ok());
  EXPECT_TRUE(ParseNpy(MakeNpy(1, Header("<b1", "(1,)"), "\x01"), "x").ok());
}

TEST(NpyTest, FortranOrderIsTransposed) {
  // a = [[1, 2, 3], [4, 5, 6]] stored column-major: 1 4 2 5 3 6.
  const int32_t column_major[6] = {1, 4, 2, 5, 3, 6};
  absl::StatusOr<NpyArray> a = ParseNpy(MakeNpy(1, Header("<i4", "(2, 3)", true), Bytes(column_major, 24)), "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(Values<int32_t>(*a), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  // Big-endian and Fortran order together; 1-d is unaffected.
  absl::StatusOr<NpyArray> b =
      ParseNpy(MakeNpy(1, Header(">i2", "(2, 2)", true), std::string("\0\1\0\3\0\2\0\4", 8)), "x");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Values<int16_t>(*b), (std::vector<int16_t>{1, 2, 3, 4}));
  absl::StatusOr<NpyArray> c = ParseNpy(MakeNpy(1, Header("|u1", "(3,)", true), "\1\2\3"), "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data, "\1\2\3");
}

TEST(NpyTest, HeaderVariantsAreAccepted) {
  const std::string data(8, '\0');
  // Versions 2.0 and 3.0 (4-byte header length), double quotes, no trailing
  // comma, other key order, Python 2 long ints, no padding.
  EXPECT_TRUE(ParseNpy(MakeNpy(2, Header("<f4", "(2,)"), data), "x").ok());
  EXPECT_TRUE(ParseNpy(MakeNpy(3, Header("<f4", "(2,)"), data), "x").ok());
  EXPECT_TRUE(ParseNpy(MakeNpy(1, R"({"shape": (2,), "fortran_order": False, "descr": "<f4"})", data), "x").ok());
  absl::StatusOr<NpyArray> l =
      ParseNpy(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 2L), }", data), "x");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->shape, (std::vector<int64_t>{1, 2}));
}

TEST(NpyMalformedTest, BadMagic) {
  ExpectRejected("", "bad magic");
  ExpectRejected("\x93NUMP", "bad magic");
  ExpectRejected("PK\x03\x04 not npy at all", "bad magic");
}

TEST(NpyMalformedTest, UnsupportedVersion) {
  ExpectRejected(MakeNpy(4, Header("<f4", "()"), "xxxx"), "unsupported .npy format version 4.0");
  ExpectRejected(MakeNpy(1, Header("<f4", "()"), "xxxx", 1), "version 1.1");
}

TEST(NpyMalformedTest, TruncatedHeader) {
  ExpectRejected(std::string("\x93NUMPY\x01\x00\x05", 9), "truncated header length");
  ExpectRejected(std::string("\x93NUMPY\x02\x00\x05\x00\x00", 11), "truncated header length");
  ExpectRejected(MakeNpy(1, Header("<f4", "()"), "").substr(0, 30), "truncated header");
}

TEST(NpyMalformedTest, BadHeaderDict) {
  ExpectRejected(MakeNpy(1, "descr: <f4", ""), "does not start with '{'");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'shape': ()}", "xxxx"),
                 "must have the keys 'descr', 'fortran_order' and 'shape'");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", ""), "unexpected key 'x'");
  ExpectRejected(MakeNpy(1,
                         "{'descr': '<f4', 'descr': '<f4', 'fortran_order': "
                         "False, 'shape': ()}",
                         ""),
                 "'descr' twice");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", ""),
                 "'fortran_order' is not True or False");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': ()}", ""),
                 "'fortran_order' is not True or False");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", ""),
                 "ends before the closing '}'");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, ", ""), "ends before the closing '}'");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4', 3: False, 'shape': ()}", ""), "expected a quoted key");
  ExpectRejected(MakeNpy(1, Header("<f4", "()") + "junk", "xxxx"), "text after the closing");
  ExpectRejected(MakeNpy(1, "{'descr': '<f4' 'fortran_order': False, 'shape': ()}", ""), "expected ',' or '}'");
}

TEST(NpyMalformedTest, BadShape) {
  ExpectRejected(MakeNpy(1, Header("<f4", "(5)"), std::string(20, '\0')), "'shape' is not a tuple");
  ExpectRejected(MakeNpy(1, Header("<f4", "[5]"), std::string(20, '\0')), "'shape' is not a tuple");
  ExpectRejected(MakeNpy(1, Header("<f4", "(-1,)"), ""), "not a non-negative integer");
  ExpectRejected(MakeNpy(1, Header("<f4", "(1.5,)"), ""), "expected ',' or ')'");
  ExpectRejected(MakeNpy(1, Header("<f4", "(99999999999999999999,)"), ""), "too large");
  ExpectRejected(MakeNpy(1, Header("<f4", "(4294967296, 4294967296)"), ""), "overflows");
  ExpectRejected(MakeNpy(1, Header("<f8", "(4611686018427387904,)"), ""), "needs");
}

TEST(NpyMalformedTest, UnsupportedDescr) {
  ExpectRejected(MakeNpy(1, Header("<c8", "()"), std::string(8, '\0')), "unsupported descr '<c8'");
  ExpectRejected(MakeNpy(1, Header("|f4", "()"), std::string(4, '\0')), "unsupported descr '|f4'");
  ExpectRejected(MakeNpy(1, Header("<f16", "()"), std::string(16, '\0')), "unsupported descr");
  ExpectRejected(MakeNpy(1, Header("O", "()"), std::string(8, '\0')), "unsupported descr 'O'");
  ExpectRejected(MakeNpy(1, Header("<U3", "()"), std::string(12, '\0')), "unsupported descr");
  ExpectRejected(MakeNpy(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}", "xxxx"),
                 "structured dtype");
}

TEST(NpyMalformedTest, DataSizeMismatch) {
  ExpectRejected(MakeNpy(1, Header("<f4", "(2, 3)"), std::string(20, '\0')),
                 "data is 20 bytes but shape (2, 3) of '<f4' needs 6 x 4");
  ExpectRejected(MakeNpy(1, Header("<f4", "(2,)"), std::string(12, '\0')), "4 trailing bytes");
}

TEST(NpyMalformedTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadNpy(TempPath("missing.npy")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vaedecode::formats
