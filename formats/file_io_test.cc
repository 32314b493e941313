#include "formats/file_io.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace vaedecode::formats {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(FileIoTest, WriteThenRead) {
  const std::string path = TempPath("file_io_roundtrip.bin");
  const std::string a = "hello ";
  const std::string b = "world";
  ASSERT_TRUE(WriteFileAtomically(path, {{a.data(), a.size()}, {nullptr, 0}, {b.data(), b.size()}}).ok());
  absl::StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "hello world");
  EXPECT_FALSE(ReadFileToString(path + ".tmp").ok()) << "temporary file left behind";
}

TEST(FileIoTest, MissingFileIsNotFound) {
  absl::StatusOr<std::string> read = ReadFileToString(TempPath("does_not_exist"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("does_not_exist"), std::string::npos);
}

TEST(FileIoTest, DirectoryIsNotARegularFile) {
  absl::StatusOr<std::string> read = ReadFileToString(TempPath(""));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileIoTest, WriteIntoMissingFolderFails) {
  EXPECT_FALSE(WriteFileAtomically(TempPath("no/such/folder/x"), {}).ok());
}

TEST(FileIoTest, QuoteForErrorKeepsOneLine) {
  EXPECT_EQ(QuoteForError("a/b.safetensors"), "a/b.safetensors");
  EXPECT_EQ(QuoteForError("a\nb"), "a\\nb");
}

}  // namespace
}  // namespace vaedecode::formats
