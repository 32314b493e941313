#pragma once

// The port of a socket address, IPv4 or IPv6 (0 for other families): for
// the listeners and watchdogs that work on raw sockets.

#include <netinet/in.h>
#include <sys/socket.h>

namespace vaedecode::server {

inline int PortOf(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

}  // namespace vaedecode::server
