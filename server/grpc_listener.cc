#include "server/grpc_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/socket_port.h"

namespace vaedecode::server {
namespace {

// How often the accept loop looks at whether it should stop.
constexpr int kPollMs = 200;

int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  return getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 ? PortOf(addr) : 0;
}

// A listening socket on `node`:`port` (non-blocking, close-on-exec), or -1
// with why in `why`.
int Listen(const std::string& node, int port, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(node.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    *why = gai_strerror(e);
    return -1;
  }
  int listening = -1;
  *why = "no address";
  for (addrinfo* a = found; a != nullptr && listening < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (a->ai_family == AF_INET6) {
      const int no = 0;  // [::] takes IPv4 too, as gRPC's own listener does
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listening = fd;
    } else {
      *why = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  return listening;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Bind(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--listen=", address, ": use HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::unique_ptr<GrpcListener> l(new GrpcListener());
  std::string why;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    // The wildcards, as gRPC takes them: IPv6 and IPv4 together where the
    // machine has IPv6, else IPv4.
    l->fd_ = Listen("::", port, &why);
    if (l->fd_ < 0) l->fd_ = Listen("0.0.0.0", port, &why);
  } else {
    l->fd_ = Listen(host, port, &why);
  }
  if (l->fd_ < 0) return absl::UnavailableError(absl::StrCat("cannot listen on --listen=", address, ": ", why));
  l->port_ = LocalPort(l->fd_);
  l->reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return l;
}

GrpcListener::~GrpcListener() {
  Stop();
  if (fd_ >= 0) close(fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void GrpcListener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { AcceptLoop(); });
}

void GrpcListener::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  // Closed now, not at destruction: clients are refused at once while the
  // server finishes stopping, instead of waiting in the backlog.
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void GrpcListener::AcceptLoop() {
  absl::Time last_shed_log = absl::InfinitePast();
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn >= 0) {
      const int yes = 1;
      setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
      params.listener_fd = fd_;
      params.fd = conn;  // gRPC owns it from here
      acceptor_->HandleNewConnection(&params);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EINTR) continue;
    if (errno != EMFILE && errno != ENFILE) {  // ENOBUFS, ENOMEM: the kernel is short; do not spin
      absl::SleepFor(absl::Milliseconds(kPollMs));
      continue;
    }
    // No descriptor: shed this connection with the reserve's, so the client
    // is refused now and the loop does not spin on a full backlog.
    bool shed = false;
    if (reserve_fd_ >= 0) {
      close(reserve_fd_);
      const int doomed = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (doomed >= 0) close(doomed);
      shed = doomed >= 0;
      reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (!shed) {  // another thread took the reserve: wait for descriptors
      absl::SleepFor(absl::Milliseconds(kPollMs));
      if (reserve_fd_ < 0) reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
      continue;
    }
    ++shed_;
    if (absl::Now() - last_shed_log > absl::Seconds(10)) {
      last_shed_log = absl::Now();
      spdlog::warn("event=connection_shed reason=\"no free file descriptor\" shed_total={}", shed_.load());
    }
  }
}

}  // namespace vaedecode::server
