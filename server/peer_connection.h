#pragma once

// The TCP connection an HTTP request arrived on, found by its addresses, so a
// handler waiting for a decode can notice that its client has gone and
// cancel the job. cpp-httplib (Debian's 0.11) hands handlers the
// connection's addresses but not its socket, and has no disconnect callback.
//
// Threading: Find and Closed are called by the handler's own thread, which is
// the thread serving that connection: the library closes the socket only
// after the handler returns, so the descriptor found stays this
// connection's for the handler's whole life.

#include <optional>
#include <string>

namespace vaedecode::server {

class PeerConnection {
 public:
  // The connected socket of this process whose local port is `local_port`
  // and whose peer is `remote_addr`:`remote_port`; nullopt when none is
  // found (the handler then cannot watch its client).
  static std::optional<PeerConnection> Find(int local_port, const std::string& remote_addr, int remote_port);

  // The peer closed (or reset) its end: nothing more will be read from it
  // and no answer will be read. Data it sent ahead (a pipelined request) is
  // not a close. Never blocks.
  bool Closed() const;

  int fd() const { return fd_; }

 private:
  explicit PeerConnection(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace vaedecode::server
