#pragma once

// The gRPC port's listening socket and accept loop, ours rather than gRPC's:
// gRPC 1.51 stops accepting for good the first time accept() fails with
// EMFILE (out of file descriptors), even once descriptors are free again.
// Here an accept that finds no descriptor sheds that one connection (it
// closes a reserve descriptor held for this, accepts, closes the
// connection, takes the reserve back), so the client is refused at once
// instead of waiting in the backlog, and the port serves again as soon as
// descriptors are. Accepted connections go to gRPC through its external
// connection acceptor, with the server's credentials (TLS included).
//
// Threading: Bind and Start from the owner; the accept loop runs on a thread
// of its own until Stop (or destruction).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server_builder.h>

#include "absl/status/statusor.h"

namespace vaedecode::server {

class GrpcListener {
 public:
  // Binds and listens on HOST:PORT (port 0: one the kernel picks; [::] and
  // 0.0.0.0 as usual; no SO_REUSEPORT, so a second server fails to start).
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Bind(const std::string& listen);
  ~GrpcListener();  // Stop()

  int port() const { return port_; }
  // Hands every connection accepted from now on to `acceptor` (made by the
  // builder before BuildAndStart; call after it).
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  void Stop();
  // Connections closed at once because no descriptor was free.
  int64_t shed() const { return shed_.load(); }

 private:
  GrpcListener() = default;
  void AcceptLoop();

  int fd_ = -1;
  int reserve_fd_ = -1;
  int port_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> shed_{0};
  std::thread thread_;
};

}  // namespace vaedecode::server
