#include "formats/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vaedecode::formats {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file built by hand: length, header (unpadded), data.
std::string Build(const std::string& header, const std::string& data = "") {
  return LittleEndian64(header.size()) + header + data;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const std::string& bytes) {
  return SafetensorsFile::FromBuffer(bytes, "test.safetensors");
}

// Expects `bytes` to be rejected with an InvalidArgument, one-line message
// that names the file and contains `problem`.
void ExpectRejected(const std::string& bytes, const std::string& problem) {
  auto file = Parse(bytes);
  ASSERT_FALSE(file.ok()) << "accepted; expected: " << problem;
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(file.status().message());
  EXPECT_THAT(message, HasSubstr("test.safetensors: "));
  EXPECT_THAT(message, HasSubstr(problem));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// A valid single F32 [2] tensor entry with the given offsets.
std::string F32Entry(const std::string& name, int begin, int end) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"F32\",\"shape\":[", (end - begin) / 4, "],\"data_offsets\":[", begin,
                      ",", end, "]}");
}

TEST(DTypeTest, NamesSizesRoundTrip) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::kF64, 8}, {DType::kF32, 4}, {DType::kF16, 2}, {DType::kBF16, 2}, {DType::kI64, 8},
      {DType::kI32, 4}, {DType::kI16, 2}, {DType::kI8, 1},  {DType::kU64, 8},  {DType::kU32, 4},
      {DType::kU16, 2}, {DType::kU8, 1},  {DType::kBool, 1}};
  for (const auto& [dtype, size] : all) {
    EXPECT_EQ(DTypeSize(dtype), size) << DTypeName(dtype);
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeName(DType::kBool), "BOOL");
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_FALSE(ParseDType("f32").ok());
  EXPECT_FALSE(ParseDType("F8_E4M3").ok());
  EXPECT_FALSE(ParseDType("").ok());
}

TEST(SafetensorsTest, WriteThenOpenRoundTrip) {
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  const int64_t step = 12345678901234;
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xbf80};
  std::vector<TensorView> tensors(5);
  tensors[0] = {"w", DType::kF32, {2, 3}, reinterpret_cast<const uint8_t*>(weights.data()), 24};
  tensors[1] = {"step", DType::kI64, {}, reinterpret_cast<const uint8_t*>(&step), 8};
  tensors[2] = {"empty", DType::kF16, {0, 4}, nullptr, 0};
  tensors[3] = {"bytes", DType::kU8, {5}, bytes.data(), 5};
  tensors[4] = {"half", DType::kBF16, {1, 2}, reinterpret_cast<const uint8_t*>(bf16.data()), 4};
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "ünïcode"}}).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->metadata().size(), 2u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "ünïcode");

  // Written back to back in the given order; tensors() is sorted by offset
  // (the zero-size tensor shares its offset with "bytes" and sorts first).
  const std::vector<TensorView>& read = (*file)->tensors();
  ASSERT_EQ(read.size(), 5u);
  EXPECT_EQ(read[0].name, "w");
  EXPECT_EQ(read[1].name, "step");
  EXPECT_EQ(read[2].name, "empty");
  EXPECT_EQ(read[3].name, "bytes");
  EXPECT_EQ(read[4].name, "half");

  const TensorView* w = (*file)->Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->numel(), 6);
  ASSERT_EQ(w->nbytes, 24u);
  EXPECT_EQ(std::memcmp(w->data, weights.data(), 24), 0);

  const TensorView* s = (*file)->Find("step");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  int64_t step_read = 0;
  std::memcpy(&step_read, s->data, 8);
  EXPECT_EQ(step_read, step);

  const TensorView* e = (*file)->Find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->nbytes, 0u);

  const TensorView* b = (*file)->Find("bytes");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::memcmp(b->data, bytes.data(), 5), 0);
  const TensorView* h = (*file)->Find("half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(std::memcmp(h->data, bf16.data(), 4), 0);

  EXPECT_EQ((*file)->Find("missing"), nullptr);
  EXPECT_EQ((*file)->Find("__metadata__"), nullptr);
}

TEST(SafetensorsTest, WriterLayoutIsStandard) {
  const std::vector<float> a = {1, 2, 3};
  const std::vector<double> b = {4};
  auto bytes = SerializeSafetensors({{"a", DType::kF32, {3}, reinterpret_cast<const uint8_t*>(a.data()), 12},
                                     {"b", DType::kF64, {1}, reinterpret_cast<const uint8_t*>(b.data()), 8}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>((*bytes)[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes->size(), 8 + header_len + 20);
  const std::string header = bytes->substr(8, header_len);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  EXPECT_THAT(header, HasSubstr("\"data_offsets\":[0,12]"));
  EXPECT_THAT(header, HasSubstr("\"data_offsets\":[12,20]"));
  EXPECT_THAT(header, Not(HasSubstr("__metadata__")));
  EXPECT_EQ(std::memcmp(bytes->data() + 8 + header_len, a.data(), 12), 0);
  EXPECT_EQ(std::memcmp(bytes->data() + 8 + header_len + 12, b.data(), 8), 0);
}

TEST(SafetensorsTest, WriteReplacesAtomically) {
  const std::string path = TempPath("replace.safetensors");
  const uint8_t one = 1;
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kU8, {1}, &one, 1}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"y", DType::kU8, {1}, &one, 1}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE((*file)->Find("y"), nullptr);
  EXPECT_EQ((*file)->Find("x"), nullptr);
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
}

// A FIFO where a weights file should be (or a hung writer behind it) is
// refused at once; before, open() waited for a writer and stalled start-up.
TEST(SafetensorsTest, AFifoIsRefusedWithoutWaiting) {
  const std::string path = TempPath("fifo.safetensors");
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a regular file"), std::string::npos) << file.status();
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const float f[2] = {1, 2};
  const auto* p = reinterpret_cast<const uint8_t*>(f);
  auto serialize_error = [](const std::vector<TensorView>& tensors,
                            const std::map<std::string, std::string>& metadata = {}) {
    auto bytes = SerializeSafetensors(tensors, metadata);
    return bytes.ok() ? std::string("ok") : std::string(bytes.status().message());
  };
  EXPECT_THAT(serialize_error({{"a", DType::kF32, {2}, p, 8}, {"a", DType::kF32, {2}, p, 8}}),
              HasSubstr("duplicate name"));
  EXPECT_THAT(serialize_error({{"__metadata__", DType::kF32, {2}, p, 8}}), HasSubstr("reserved"));
  EXPECT_THAT(serialize_error({{"a", DType::kF32, {3}, p, 8}}), HasSubstr("does not match shape"));
  EXPECT_THAT(serialize_error({{"a", DType::kF32, {-2}, p, 8}}), HasSubstr("invalid shape"));
  EXPECT_THAT(serialize_error({{"a", DType::kF32, {2}, nullptr, 8}}), HasSubstr("null"));
  EXPECT_THAT(serialize_error({{"bad\xff", DType::kF32, {2}, p, 8}}), HasSubstr("UTF-8"));
  EXPECT_THAT(serialize_error({}, {{"k", "\xc0\x80"}}), HasSubstr("UTF-8"));
  const std::string path = TempPath("writer_error.safetensors");
  absl::Status s = WriteSafetensors(path, {{"a", DType::kF32, {3}, p, 8}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(SafetensorsTest, ZeroDimI64Parses) {
  auto file =
      Parse(Build(R"({"n":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})", std::string("\x07\0\0\0\0\0\0\0", 8)));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 1u);
  const TensorView& n = (*file)->tensors()[0];
  EXPECT_EQ(n.dtype, DType::kI64);
  EXPECT_TRUE(n.shape.empty());
  EXPECT_EQ(n.numel(), 1);
  EXPECT_EQ(n.data[0], 7);
}

TEST(SafetensorsTest, EmptyHeaderObjectHasNoTensors) {
  auto file = Parse(Build("{}      "));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(SafetensorsTest, UnalignedDataIsReadable) {
  // Header length 41 (not a multiple of 8): data is not 4-byte aligned.
  const float v = 2.5f;
  const std::string header = R"({"x":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  auto file = Parse(Build(header, std::string(reinterpret_cast<const char*>(&v), 4)));
  ASSERT_TRUE(file.ok()) << file.status();
  float read = 0;
  std::memcpy(&read, (*file)->tensors()[0].data, 4);
  EXPECT_EQ(read, 2.5f);
}

TEST(SafetensorsTest, GapsAreAllowed) {
  auto file = Parse(Build("{" + F32Entry("a", 0, 8) + "," + F32Entry("b", 16, 24) + "}", std::string(32, '\0')));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 2u);
}

TEST(SafetensorsTest, ZeroSizeTensorsOverlapNothing) {
  auto file = Parse(Build("{" + F32Entry("a", 0, 8) +
                              R"(,"e1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]})"
                              R"(,"e2":{"dtype":"F32","shape":[3,0],"data_offsets":[4,4]}})",
                          std::string(8, '\0')));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 3u);
}

TEST(SafetensorsTest, OpenEmptyFileIsAnError) {
  const std::string path = TempPath("empty.safetensors");
  WriteBytes(path, "");
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("empty"));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
}

TEST(SafetensorsTest, OpenMissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(TempPath("missing.safetensors"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, OpenDirectoryIsAnError) {
  auto file = SafetensorsFile::Open(TempPath(""));
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a regular file"));
}

TEST(SafetensorsTest, OpenValidatesLikeFromBuffer) {
  const std::string path = TempPath("bad.safetensors");
  WriteBytes(path, Build("not json"));
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not valid JSON"));
}

// One test per kind of malformation.

TEST(SafetensorsMalformedTest, ShorterThanEightBytes) {
  ExpectRejected("", "empty");
  ExpectRejected("\x02\0\0", "shorter than the 8-byte header length");
}

TEST(SafetensorsMalformedTest, HeaderLengthZero) { ExpectRejected(LittleEndian64(0) + "{}", "header length is 0"); }

TEST(SafetensorsMalformedTest, HeaderLengthPastEndOfFile) {
  ExpectRejected(LittleEndian64(100) + "{}", "runs past the end");
  ExpectRejected(LittleEndian64(~uint64_t{0}) + "{}", "exceeds the limit");
}

TEST(SafetensorsMalformedTest, HeaderLengthAbsurd) {
  ExpectRejected(LittleEndian64(100'000'001) + std::string(64, ' '), "exceeds the limit");
}

TEST(SafetensorsMalformedTest, HeaderNotJson) {
  ExpectRejected(Build("{\"a\": "), "not valid JSON");
  ExpectRejected(Build("{} trailing"), "not valid JSON");
  ExpectRejected(Build("{\"\xff\": 1}"), "not valid JSON");
}

TEST(SafetensorsMalformedTest, HeaderTooDeep) {
  ExpectRejected(Build(std::string(65, '[') + std::string(65, ']')), "nests deeper than 64 levels");
  ExpectRejected(Build(R"({"a":)" + std::string(70, '[') + std::string(70, ']') + "}"), "nests deeper");
  // Deep but within the limit: a JSON error of the ordinary kind.
  ExpectRejected(Build(std::string(64, '[') + std::string(64, ']')), "not an object");
  // A 10 MB header of brackets is rejected quickly, without building a DOM.
  ExpectRejected(Build(std::string(10'000'000, '[')), "nests deeper");
}

TEST(SafetensorsMalformedTest, HeaderNotObject) {
  ExpectRejected(Build("[1, 2]"), "not an object");
  ExpectRejected(Build("\"str\""), "not an object");
  ExpectRejected(Build("null"), "not an object");
}

TEST(SafetensorsMalformedTest, EntryNotObject) {
  ExpectRejected(Build(R"({"a": [1, 2]})"), "tensor 'a': entry is a JSON array");
}

TEST(SafetensorsMalformedTest, MissingFields) {
  ExpectRejected(Build(R"({"a":{"shape":[],"data_offsets":[0,4]}})", "xxxx"), "missing \"dtype\"");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "xxxx"), "missing \"shape\"");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[]}})", "xxxx"), "missing \"data_offsets\"");
}

TEST(SafetensorsMalformedTest, WrongJsonTypes) {
  ExpectRejected(Build(R"({"a":{"dtype":4,"shape":[],"data_offsets":[0,4]}})", "xxxx"), "\"dtype\" is a JSON number");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "xxxx"),
                 "\"shape\" is a JSON number");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", "xxxx"),
                 "shape dimension 0 is a JSON number, not an integer");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", "xxxx"),
                 "shape dimension 0 is a JSON string");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "xxxx"),
                 "shape dimension 0 is a JSON array");
}

TEST(SafetensorsMalformedTest, UnknownDType) {
  ExpectRejected(Build(R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "xxxx"),
                 "tensor 'a': unknown dtype 'F8_E4M3'");
  ExpectRejected(Build(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "xxxx"), "unknown dtype 'f32'");
}

TEST(SafetensorsMalformedTest, NegativeDimension) {
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})"),
                 "shape dimension 1 is negative (-1)");
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})"),
                 "shape dimension 0 is too large");
}

TEST(SafetensorsMalformedTest, ShapeProductOverflow) {
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"), "overflows");
  // Zeros do not hide an overflow in the other dimensions.
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[4294967296,0,4294967296],"data_offsets":[0,0]}})"), "overflows");
  // numel fits in int64 but numel * 8 bytes does not fit in 64 bits.
  ExpectRejected(Build(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})"), "hold 0 bytes");
}

TEST(SafetensorsMalformedTest, BadDataOffsets) {
  const std::string want = "\"data_offsets\" must be two non-negative integers";
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x"), want);
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "xx"), want);
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x"), want);
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}})", "x"), want);
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":{"0":1}}})", "x"), want);
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.5]}})", "x"), want);
  // The offending value is quoted (escaped) and cut short.
  auto file = Parse(Build(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":")" + std::string(1000, 'z') + "\"}}"));
  ASSERT_FALSE(file.ok());
  const std::string message(file.status().message());
  EXPECT_THAT(message, HasSubstr("got \\\"zzzz"));
  EXPECT_THAT(message, HasSubstr("zzz..."));
  EXPECT_LT(message.size(), 200u);
}

TEST(SafetensorsMalformedTest, BeginAfterEnd) {
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", "xx"), "begin after end");
}

TEST(SafetensorsMalformedTest, EndPastDataSection) {
  ExpectRejected(Build(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "xxx"),
                 "run past the end of the 3-byte data section");
  ExpectRejected(
      Build(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[9223372036854775807,9223372036854775807]}})", "xxx"),
      "run past the end");
}

TEST(SafetensorsMalformedTest, ByteLengthMismatch) {
  ExpectRejected(Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxxxxxx"),
                 "hold 4 bytes but shape [2] of F32 needs 2 x 4");
  ExpectRejected(Build(R"({"a":{"dtype":"F16","shape":[],"data_offsets":[0,4]}})", "xxxx"),
                 "hold 4 bytes but shape [] of F16");
}

TEST(SafetensorsMalformedTest, OverlappingTensors) {
  ExpectRejected(Build("{" + F32Entry("a", 0, 8) + "," + F32Entry("b", 4, 12) + "}", std::string(12, '\0')),
                 "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  // Identical ranges overlap too.
  ExpectRejected(Build("{" + F32Entry("a", 0, 8) + "," + F32Entry("b", 0, 8) + "}", std::string(8, '\0')), "overlap");
  // b lies inside a; c after b is still inside a.
  ExpectRejected(Build("{" + F32Entry("a", 0, 32) + "," + F32Entry("b", 4, 8) + "}", std::string(32, '\0')), "overlap");
}

TEST(SafetensorsMalformedTest, MetadataNotObjectOfStrings) {
  ExpectRejected(Build(R"({"__metadata__": ["pt"]})"), "\"__metadata__\" is a JSON array");
  ExpectRejected(Build(R"({"__metadata__": null})"), "\"__metadata__\" is a JSON null");
  ExpectRejected(Build(R"({"__metadata__": {"format": 1}})"), "\"__metadata__\" value for 'format' is a JSON number");
}

TEST(SafetensorsMalformedTest, DuplicateNames) {
  // JSON parsers differ on duplicate keys (nlohmann keeps the last); a
  // silently dropped tensor would be worse than an error.
  ExpectRejected(Build("{" + F32Entry("a", 0, 8) + "," + F32Entry("a", 8, 16) + "}", std::string(16, '\0')),
                 "duplicate key 'a'");
  // Duplicate keys deeper down are only rejected where they matter.
  ExpectRejected(Build(R"({"a":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}})"),
                 "tensor 'a': duplicate key 'dtype'");
}

TEST(SafetensorsMalformedTest, NamesAreEscapedInErrors) { ExpectRejected(Build(R"({"a\nb": 1})"), "tensor 'a\\nb'"); }

// The fuzz seed corpus doubles as a table of cases: hand-made valid_* seeds
// must parse, bad_* seeds must be rejected; crash-* inputs found by the
// fuzzer only have to come back without crashing (safetensors_corpus_test).
TEST(SafetensorsCorpusTest, SeedsHaveTheirExpectedOutcome) {
  int valid = 0;
  int bad = 0;
  for (const auto& entry : std::filesystem::directory_iterator("formats/testdata/safetensors_corpus")) {
    const std::string name = entry.path().filename().string();
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto file = SafetensorsFile::FromBuffer(bytes, name);
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_TRUE(file.ok()) << name << ": " << file.status();
      ++valid;
    } else if (name.rfind("bad_", 0) == 0) {
      EXPECT_FALSE(file.ok()) << name;
      EXPECT_THAT(std::string(file.status().message()), HasSubstr(name));
      ++bad;
    }
  }
  EXPECT_GE(valid, 5);
  EXPECT_GE(bad, 10);
}

TEST(ShardIndexTest, ReadsDistinctShardsInOrder) {
  const std::string dir = TempPath("sharded");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, R"({"metadata": {"total_size": 16},
    "weight_map": {"a": "model-00002-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  auto shards = ReadShardIndex(index);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, (std::vector<std::string>{dir + "/model-00001-of-00002.safetensors",
                                               dir + "/model-00002-of-00002.safetensors"}));
}

TEST(ShardIndexTest, AKeyPrefixKeepsTheShardsHoldingIt) {
  const std::string dir = TempPath("sharded_prefix");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, R"({"weight_map": {"model.a": "model-00001-of-00003.safetensors",
                                        "vae.b": "model-00003-of-00003.safetensors",
                                        "model.vae.c": "model-00002-of-00003.safetensors"}})");
  auto shards = ReadShardIndex(index, "vae.");
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, (std::vector<std::string>{dir + "/model-00003-of-00003.safetensors"}));
  EXPECT_THAT(std::string(ReadShardIndex(index, "audio_vae.").status().message()),
              HasSubstr("no tensor named \"audio_vae....\""));
}

TEST(ShardIndexTest, RelativeIndexPathIsResolved) {
  const std::string dir = TempPath("sharded_rel");
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  WriteBytes(dir + "/i.json", R"({"weight_map": {"a": "s.safetensors"}})");
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  auto shards = ReadShardIndex("i.json");
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 1u);
  EXPECT_EQ(shards->front().front(), '/');
  EXPECT_THAT(shards->front(), HasSubstr("sharded_rel/s.safetensors"));
}

TEST(ShardIndexTest, Errors) {
  const std::string index = TempPath("bad.safetensors.index.json");
  auto error_for = [&index](const std::string& json) {
    WriteBytes(index, json);
    auto shards = ReadShardIndex(index);
    EXPECT_FALSE(shards.ok()) << json;
    EXPECT_THAT(std::string(shards.status().message()), HasSubstr(index));
    return std::string(shards.status().message());
  };
  EXPECT_THAT(error_for("{\"weight_map\": "), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_for("[]"), HasSubstr("not an object"));
  EXPECT_THAT(error_for(R"({"metadata": {}})"), HasSubstr("missing \"weight_map\""));
  EXPECT_THAT(error_for(R"({"weight_map": []})"), HasSubstr("not an object"));
  EXPECT_THAT(error_for(R"({"weight_map": {}})"), HasSubstr("empty"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": 3}})"), HasSubstr("not a string"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": "../x.safetensors"}})"), HasSubstr("not a plain file name"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": "sub/x.safetensors"}})"), HasSubstr("not a plain file name"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": "/etc/passwd"}})"), HasSubstr("not a plain file name"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": ".."}})"), HasSubstr("not a plain file name"));
  EXPECT_THAT(error_for(R"({"weight_map": {"a": ""}})"), HasSubstr("not a plain file name"));
  EXPECT_EQ(ReadShardIndex(TempPath("no_index.json")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vaedecode::formats
