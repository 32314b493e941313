#include "server/peer_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace vaedecode::server {
namespace {

// The numeric address and port of `addr`, as httplib reports a peer.
bool AddressOf(const sockaddr_storage& addr, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) return false;
    *port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)) == nullptr) return false;
    *port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

// httplib may write an IPv6 peer with a zone ("fe80::1%eth0") or an
// IPv4-mapped one; compare the address part only.
bool SameHost(const std::string& found, const std::string& given) {
  if (found == given) return true;
  const std::string bare = given.substr(0, given.find('%'));
  return found == bare || found == "::ffff:" + bare || "::ffff:" + found == bare;
}

}  // namespace

std::optional<PeerConnection> PeerConnection::Find(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  std::optional<PeerConnection> found;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    std::string local_host, peer_host;
    int local_p = 0, peer_p = 0;
    if (!AddressOf(local, &local_host, &local_p) || !AddressOf(peer, &peer_host, &peer_p)) continue;
    if (local_p == local_port && peer_p == remote_port && SameHost(peer_host, remote_addr)) {
      found = PeerConnection(static_cast<int>(fd));
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerConnection::Closed() const {
  pollfd p{};
  p.fd = fd_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;  // nothing happened (or EINTR: ask again later)
  if ((p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) != 0) {
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;                                                              // end of stream
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;  // reset
    return false;                                                                         // a request sent ahead
  }
  return (p.revents & POLLRDHUP) != 0;
}

}  // namespace vaedecode::server
