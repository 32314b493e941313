#pragma once

// What an adversary does to a server, for the reliability and adversarial
// tests: uploads that stall, HTTP requests that trickle, model folders that
// cannot load.
//
// Threading: each object is used by one test thread (its own threads are
// internal); the functions have no shared state.

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace vaedecode::testing {

// A TCP proxy on loopback to `target_port` that forwards each connection's
// first `upload_bytes` upstream and then nothing more, holding the
// connection open: a client whose upload stalls before its message is
// complete. Replies are forwarded whole, and a close on either side reaches
// the other.
class StallingProxy {
 public:
  StallingProxy(int target_port, size_t upload_bytes);
  ~StallingProxy();  // closes every connection
  int port() const { return port_; }

 private:
  void Accept();
  void Forward(int from, int to, size_t limit);

  int target_port_;
  size_t upload_bytes_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<int> fds_;  // by the accept thread, then the destructor
  std::vector<std::thread> threads_;
};

// Sends `head` to 127.0.0.1:`port`, then `trickle` a byte every `gap`
// (slowloris), and returns what the server answered by the time it closed
// the connection or `give_up` passed ("" if nothing).
std::string TrickleHttpRequest(int port, const std::string& head, const std::string& trickle, double gap_s,
                               double give_up_s);

// A model folder: `config` with the weights of fixture `weights_fixture`
// linked in.
void WriteModelFolder(const std::string& dir, const nlohmann::json& config, const std::string& weights_fixture);

}  // namespace vaedecode::testing
