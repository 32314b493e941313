#include "parallel/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "parallel/comm_util.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel {
namespace {

constexpr std::string_view kAbortKey = "abort";

std::string JoinKey(int rank) { return absl::StrCat("join/", rank); }

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// A socket bound to host:port, for the master to listen on; c10d takes
// ownership of it. Binding it here is what keeps the store off the other
// interfaces.
absl::StatusOr<int> BindListenSocket(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("TCPStore host must be an IPv4 address to bind, got '", host, "'"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("TCPStore: socket: ", std::strerror(errno)));
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("TCPStore: bind ", host, ":", port, ": ", std::strerror(err)));
  }
  return fd;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectTcpStore(const TcpStoreOptions& options) {
  if (options.port <= 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCPStore port must be in [1, 65535] and agreed by every rank, got ", options.port));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::string what =
      absl::StrCat("TCPStore ", options.is_master ? "host" : "connect", " ", options.host, ":", options.port);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.port);
  store_options.isServer = options.is_master;
  // Do not block the master until clients connect (numWorkers stays unset):
  // the group join does that with a bounded wait and names the missing ranks.
  store_options.waitWorkers = false;
  if (options.is_master) {
    ASSIGN_OR_RETURN(int fd, BindListenSocket(options.host, options.port));
    store_options.masterListenFd = fd;
  }
  // Two c10d connect quirks shape this loop: its connect timeout has
  // whole-second resolution (under 1 s fails before trying), and after a
  // refused connection (master not listening yet) it sleeps a fixed second
  // if the timeout allows. One-second attempts fail at once when refused, so
  // retrying them here connects within ~20 ms of the master coming up.
  absl::Status last_error;
  do {
    const absl::Duration attempt = options.is_master ? std::max(options.timeout, absl::Seconds(1)) : absl::Seconds(1);
    store_options.timeout = ToChrono(attempt);
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(options.host, store_options);
      // Later operations get the full timeout, not the attempt's.
      store->setTimeout(ToChrono(options.timeout));
      return c10::intrusive_ptr<c10d::Store>(std::move(store));
    } catch (...) {
      last_error = StatusFromException(std::current_exception(), what, deadline);
    }
    if (options.is_master) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (absl::Now() < deadline);
  return last_error;
}

absl::StatusOr<std::unique_ptr<GroupStore>> GroupStore::Create(c10::intrusive_ptr<c10d::Store> store,
                                                               std::string_view group_name, int rank, int world_size) {
  if (!store) return absl::InvalidArgumentError("GroupStore: null store");
  if (group_name.empty() || group_name.find('/') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("GroupStore: group name must be non-empty and contain no '/': '", AsAbsl(group_name), "'"));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("GroupStore: rank ", rank, " invalid for world size ", world_size));
  }
  auto prefixed =
      c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("vaedecode/", AsAbsl(group_name)), std::move(store));
  return std::unique_ptr<GroupStore>(new GroupStore(std::move(prefixed), std::string(group_name), rank, world_size));
}

GroupStore::GroupStore(c10::intrusive_ptr<c10d::Store> prefixed, std::string group_name, int rank, int world_size)
    : prefixed_(std::move(prefixed)), group_name_(std::move(group_name)), rank_(rank), world_size_(world_size) {}

absl::Status GroupStore::Join(absl::Time deadline) {
  const std::string what = absl::StrCat("group '", group_name_, "' rank ", rank_, ": join");
  std::vector<std::string> keys;
  keys.reserve(world_size_);
  for (int r = 0; r < world_size_; ++r) keys.push_back(JoinKey(r));
  try {
    prefixed_->set(JoinKey(rank_), std::vector<uint8_t>{1});
  } catch (...) {
    return StatusFromException(std::current_exception(), what, deadline);
  }
  try {
    prefixed_->wait(keys, RemainingMillis(deadline));
    return absl::OkStatus();
  } catch (...) {
    absl::Status failure = StatusFromException(std::current_exception(), what, deadline);
    // Name the ranks that did not come; the store may be gone too.
    std::vector<int> missing;
    try {
      for (int r = 0; r < world_size_; ++r) {
        if (!prefixed_->check({keys[r]})) missing.push_back(r);
      }
    } catch (...) {
      return failure;
    }
    if (missing.empty()) return failure;
    return absl::Status(failure.code(), absl::StrCat("group '", group_name_, "': rank(s) ", absl::StrJoin(missing, ","),
                                                     " of ", world_size_, " did not join (", failure.message(), ")"));
  }
}

void GroupStore::PublishAbort(std::string_view reason) {
  const std::string message = absl::StrCat("rank ", rank_, ": ", AsAbsl(reason));
  try {
    prefixed_->set(std::string(kAbortKey), std::vector<uint8_t>(message.begin(), message.end()));
  } catch (...) {
    // The store is unreachable (its host failed); peers learn of the failure
    // from their own transport errors or timeouts.
  }
}

absl::StatusOr<std::optional<std::string>> GroupStore::CheckAbort() {
  try {
    if (!prefixed_->check({std::string(kAbortKey)})) return std::nullopt;
    const std::vector<uint8_t> value = prefixed_->get(std::string(kAbortKey));
    return std::optional<std::string>(std::string(value.begin(), value.end()));
  } catch (...) {
    return StatusFromException(std::current_exception(), "abort check: store unreachable", absl::InfiniteFuture());
  }
}

absl::Status GroupStore::Set(std::string_view key, std::string_view value) {
  try {
    prefixed_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
    return absl::OkStatus();
  } catch (...) {
    return StatusFromException(std::current_exception(), absl::StrCat("store set '", AsAbsl(key), "'"),
                               absl::InfiniteFuture());
  }
}

absl::StatusOr<std::string> GroupStore::WaitAndGet(std::string_view key, absl::Time deadline) {
  const std::string k(key);
  try {
    prefixed_->wait({k}, RemainingMillis(deadline));
    const std::vector<uint8_t> value = prefixed_->get(k);
    return std::string(value.begin(), value.end());
  } catch (...) {
    return StatusFromException(std::current_exception(), absl::StrCat("store wait '", AsAbsl(key), "'"), deadline);
  }
}

}  // namespace vaedecode::parallel
