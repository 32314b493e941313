#pragma once

// A TCP port on 127.0.0.1 for a worker group's store, held for the group: the
// server picks it (it does not link LibTorch) and so do the CLI's local
// groups and the multi-process tests.
//
// Picking a port by binding port 0 and closing the socket leaves a window in
// which another process's bind or outgoing connection can take the port
// before the store binds it; with tests running side by side that window was
// hit. A ReservedPort closes it: the socket stays bound (not listening) with
// SO_REUSEADDR, which keeps every other bind and every kernel-chosen port
// off it, while the store's own listening socket (parallel/store.cc, also
// SO_REUSEADDR) may bind it beside the reservation, in this process or in
// another one. Keep the reservation until the store listens.
//
// Thread-safe: distinct objects are independent.

#include "absl/status/statusor.h"

namespace vaedecode::rpc {

class ReservedPort {
 public:
  // Binds 127.0.0.1:0 and keeps the socket.
  static absl::StatusOr<ReservedPort> Take();

  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&& other) noexcept;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort();

  int port() const { return port_; }

 private:
  ReservedPort(int fd, int port) : fd_(fd), port_(port) {}

  int fd_ = -1;
  int port_ = 0;
};

}  // namespace vaedecode::rpc
