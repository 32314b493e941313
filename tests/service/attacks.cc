#include "tests/service/attacks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  return addr;
}

}  // namespace

StallingProxy::StallingProxy(int target_port, size_t upload_bytes)
    : target_port_(target_port), upload_bytes_(upload_bytes) {
  listener_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listener_, 64);
  socklen_t len = sizeof(addr);
  getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  threads_.emplace_back([this] { Accept(); });
}

StallingProxy::~StallingProxy() {
  stop_ = true;
  shutdown(listener_, SHUT_RDWR);
  threads_.front().join();  // the accept thread: fds_ and threads_ are final
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  for (size_t i = 1; i < threads_.size(); ++i) threads_[i].join();
  for (int fd : fds_) close(fd);
  close(listener_);
}

void StallingProxy::Accept() {
  for (;;) {
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0 || stop_) {
      if (client >= 0) close(client);
      return;
    }
    const int upstream = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(target_port_);
    connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fds_.push_back(client);
    fds_.push_back(upstream);
    threads_.emplace_back([this, client, upstream] { Forward(client, upstream, upload_bytes_); });
    threads_.emplace_back([this, client, upstream] { Forward(upstream, client, SIZE_MAX); });
  }
}

void StallingProxy::Forward(int from, int to, size_t limit) {
  std::vector<char> buffer(1 << 16);
  size_t sent = 0;
  while (!stop_ && sent < limit) {
    const ssize_t n = recv(from, buffer.data(), std::min(buffer.size(), limit - sent), 0);
    if (n <= 0 || send(to, buffer.data(), n, MSG_NOSIGNAL) != n) {
      shutdown(to, SHUT_RDWR);  // a close on one side reaches the other
      return;
    }
    sent += n;
  }
  while (!stop_) absl::SleepFor(absl::Milliseconds(50));  // stalled: the connection stays open
}

std::string TrickleHttpRequest(int port, const std::string& head, const std::string& trickle, double gap_s,
                               double give_up_s) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(port);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size())) {
    const absl::Time give_up = absl::Now() + absl::Seconds(give_up_s);
    size_t next = 0;
    bool closed = false;
    while (!closed && absl::Now() < give_up) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(gap_s * 1000)) > 0) {
        char buffer[4096];
        const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
        if (n <= 0) {
          closed = true;
        } else {
          answer.append(buffer, n);
        }
      } else if (next < trickle.size()) {
        send(fd, &trickle[next++], 1, MSG_NOSIGNAL);
      }
    }
  }
  close(fd);
  return answer;
}

void WriteModelFolder(const std::string& dir, const nlohmann::json& config, const std::string& weights_fixture) {
  std::filesystem::create_directory(dir);
  std::ofstream(dir + "/config.json") << config.dump();
  std::filesystem::create_symlink(
      std::filesystem::absolute(FixturePath(weights_fixture + "/diffusion_pytorch_model.safetensors")),
      dir + "/diffusion_pytorch_model.safetensors");
}

}  // namespace vaedecode::testing
