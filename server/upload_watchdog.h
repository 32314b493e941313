#pragma once

// Bounds the time a gRPC request may take to arrive. gRPC 1.51 runs no
// handler before a request's message is whole, so no handler can time an
// upload; its channelz records can: each connection's last stream opened by
// the client, and the last message received on it. A connection whose
// newest stream has waited longer than the bound with no message since, and
// is still open, is shut down (its calls fail UNAVAILABLE), logged and
// counted. A client that keeps opening fresh streams on the same connection
// is not caught by this; the resource quota still bounds its memory.
//
// Threading: a thread of its own sweeps every second until destruction.

#include <atomic>
#include <cstdint>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace vaedecode::server {

class UploadWatchdog {
 public:
  // Watches the connections accepted on local port `grpc_port`.
  UploadWatchdog(absl::Duration bound, int grpc_port);
  ~UploadWatchdog();

  // Connections shut down because an upload took longer than the bound.
  int64_t cut() const { return cut_.load(); }

 private:
  void Sweep();

  const absl::Duration bound_;
  const int grpc_port_;
  std::atomic<int64_t> cut_{0};
  std::set<int64_t> cut_sockets_;  // channelz ids already shut down (the sweep thread's)
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace vaedecode::server
