#include "rpc/blocked_file_io.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace vaedecode::rpc {
namespace {

using ::testing::HasSubstr;

// A child running `cat path`, killed at the end of the test.
class Cat {
 public:
  explicit Cat(const std::string& path) {
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/cat", "cat", path.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Cat() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// Polls until the child's description holds `want` (it needs a moment to
// reach the call); the last description.
std::string WaitFor(pid_t pid, const std::string& want) {
  std::string seen;
  for (int i = 0; i < 100; ++i) {
    seen = DescribeBlockedFileIo(pid);
    if (seen.find(want) != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return seen;
}

std::string Fifo(const std::string& name) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  unlink(path.c_str());
  EXPECT_EQ(mkfifo(path.c_str(), 0600), 0);
  return path;
}

// A FIFO with no writer blocks open() as a hung mount does.
TEST(BlockedFileIoTest, NamesTheFileAProcessWaitsToOpen) {
  const std::string path = Fifo("no_writer");
  Cat cat(path);
  EXPECT_THAT(WaitFor(cat.pid(), "open"), HasSubstr(absl::StrCat("(\"", path, "\")")));
}

// With a writer that sends nothing, the open succeeds and the read blocks.
TEST(BlockedFileIoTest, NamesTheFileAProcessWaitsToRead) {
  const std::string path = Fifo("silent_writer");
  const int writer = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(writer, 0);
  Cat cat(path);
  EXPECT_EQ(WaitFor(cat.pid(), "read("), absl::StrCat("read(\"", path, "\")"));
  close(writer);
}

TEST(BlockedFileIoTest, SaysNothingOfAProcessWaitingOnAPipe) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[1]);
    char c;
    (void)!read(fds[0], &c, 1);
    _exit(0);
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(DescribeBlockedFileIo(child), "");
  close(fds[1]);
  close(fds[0]);
  waitpid(child, nullptr, 0);
}

}  // namespace
}  // namespace vaedecode::rpc
