#pragma once

// cpp-httplib's server with the bounds its Debian version (0.11) lacks, for
// the HTTP decode port. The library times each recv alone, so a client that
// sends a header byte every few seconds (slowloris) or a body at a trickle
// holds a thread forever, and its thread pool queues connections without
// limit, so idle ones delay every request behind them. Here:
//
// - at most `max_connections` connections are served at once; one beyond
//   gets 503 with a JSON error naming the limit and is closed at once (the
//   pool has spare threads for these refusals, so they never wait);
// - a connection waits at most `keep_alive` for a request to start, its
//   request line and headers (at most 64 KiB, else 431) must arrive within
//   `header_timeout` of their first byte (else 408 and the connection is
//   closed), its body within `body_timeout` of the headers, and its reply
//   may take `write_timeout` in all to be read;
// - once the server stops, reads end at once and a reply being written gets
//   5 s more, so slow clients cannot hold the drain;
// - a request whose body was not read whole (408, 413, 415, 431) ends its
//   connection, so the rest is not read as another request.
//
// Each connection runs on one pool thread through a stream of our own
// (connection_stream in the .cc) whose reads and writes wait for the
// current deadline, then httplib's own request parsing (process_request).
//
// Threading: as httplib::Server; the static queries are for handlers, about
// the connection of the calling thread.

#include <atomic>
#include <cstdint>

#include <httplib.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace vaedecode::server {

struct HttpConnectionLimits {
  int max_connections = 64;
  absl::Duration keep_alive = absl::Seconds(5);
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(120);
  absl::Duration write_timeout = absl::Seconds(120);
};

class BoundedHttpServer : public httplib::Server {
 public:
  explicit BoundedHttpServer(HttpConnectionLimits limits);

  // For handlers (the error handler, one reading a body): OK, or the wire
  // limit the calling thread's request broke — DEADLINE_EXCEEDED naming the
  // deadline that passed (its headers' or its body's), answered 408, or
  // RESOURCE_EXHAUSTED for headers over 64 KiB, answered 431 — with that
  // HTTP status in `http_status`.
  static absl::Status WireRefusal(int* http_status);

  int active_connections() const { return active_.load(); }
  int64_t refused_connections() const { return refused_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  void Refuse(socket_t sock);

  const HttpConnectionLimits limits_;
  std::atomic<int> active_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace vaedecode::server
