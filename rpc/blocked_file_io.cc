#include "rpc/blocked_file_io.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::rpc {
namespace {

// A blocking call that names a file: by a path argument, or by a descriptor.
struct FileCall {
  long number;
  const char* name;
  int path_arg;  // the argument holding a path, or -1
  int fd_arg;    // the argument holding a descriptor, or -1
};

const std::vector<FileCall>& FileCalls() {
  static const std::vector<FileCall> calls = {
#ifdef SYS_open
      {SYS_open, "open", 0, -1},
#endif
#ifdef SYS_stat
      {SYS_stat, "stat", 0, -1},
#endif
#ifdef SYS_lstat
      {SYS_lstat, "lstat", 0, -1},
#endif
#ifdef SYS_newfstatat
      {SYS_newfstatat, "fstatat", 1, -1},
#endif
#ifdef SYS_openat2
      {SYS_openat2, "openat2", 1, -1},
#endif
      {SYS_openat, "openat", 1, -1},      {SYS_statx, "statx", 1, -1}, {SYS_read, "read", -1, 0},
      {SYS_pread64, "pread64", -1, 0},    {SYS_readv, "readv", -1, 0}, {SYS_preadv, "preadv", -1, 0},
      {SYS_fstat, "fstat", -1, 0},
  };
  return calls;
}

// A NUL-terminated string at `address` in the process's memory.
std::optional<std::string> ReadString(pid_t pid, uint64_t address) {
  const int fd = open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out(4096, '\0');
  const ssize_t n = pread(fd, out.data(), out.size(), static_cast<off_t>(address));
  close(fd);
  if (n <= 0) return std::nullopt;
  out.resize(static_cast<size_t>(n));
  const size_t end = out.find('\0');
  if (end != std::string::npos) out.resize(end);
  return out;
}

// What one thread's /proc/.../syscall line says it waits on; "" if no file.
std::string Describe(pid_t pid, const std::string& line) {
  std::istringstream in(line);
  long number = -1;
  if (!(in >> number)) return "";  // "running"
  std::vector<uint64_t> args;
  std::string word;
  while (in >> word && args.size() < 6) args.push_back(std::strtoull(word.c_str(), nullptr, 16));
  for (const FileCall& call : FileCalls()) {
    if (call.number != number) continue;
    std::string path;
    if (call.path_arg >= 0 && static_cast<size_t>(call.path_arg) < args.size()) {
      path = ReadString(pid, args[call.path_arg]).value_or("");
    } else if (call.fd_arg >= 0 && static_cast<size_t>(call.fd_arg) < args.size()) {
      std::error_code ec;
      path = std::filesystem::read_symlink(absl::StrCat("/proc/", pid, "/fd/", args[call.fd_arg]), ec).string();
    }
    if (path.empty() || path.front() != '/') return "";  // a pipe, a socket, an anonymous file
    return absl::StrCat(call.name, "(\"", path, "\")");
  }
  return "";
}

std::string Probe(pid_t pid) {
  std::vector<std::string> found;
  std::error_code ec;
  std::filesystem::directory_iterator task(absl::StrCat("/proc/", pid, "/task"), ec);
  for (; !ec && task != std::filesystem::directory_iterator(); task.increment(ec)) {
    std::ifstream syscall(task->path() / "syscall");
    std::string line;
    if (!std::getline(syscall, line)) continue;
    std::string what = Describe(pid, line);
    if (!what.empty()) found.push_back(std::move(what));
  }
  return absl::StrJoin(found, ", ");
}

}  // namespace

std::string DescribeBlockedFileIo(pid_t pid) {
  // Reading another process's memory takes its memory map lock, which a
  // thread faulting on a file of a hung mount may hold against it: the
  // probe gets a thread of its own and a second to answer.
  auto answer = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = answer->get_future();
  std::thread([pid, answer] { answer->set_value(Probe(pid)); }).detach();
  if (result.wait_for(std::chrono::seconds(1)) != std::future_status::ready) return "";
  return result.get();
}

}  // namespace vaedecode::rpc
