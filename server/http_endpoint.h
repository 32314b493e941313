#pragma once

// The HTTP endpoint (--http_listen): diffusers' remote_decode() protocol
// (server/remote_decode.h) on cpp-httplib, in the server process, feeding
// the same admission, queue, limits, metrics and logs as the gRPC Decode
// (DecodeService::DecodeCollected, protocol "http").
//
//   POST /               decode with the default model (--http_default_model,
//                        or the only model served)
//   POST /models/NAME    decode with model NAME
//   GET  /health         "Ok" while the model (any model for /health) is
//                        served and the server is not draining; 503 otherwise
//   GET  /health/NAME    the same for one model
//
// A request's deadline is --http_request_timeout_s from its arrival.
// Threading: requests run on the library's thread pool; Stop from the owner.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/decode_service.h"
#include "server/model_catalog.h"

namespace httplib {
class Server;
}

namespace vaedecode::server {

struct HttpEndpointOptions {
  std::string listen;         // HOST:PORT (port 0: any free port)
  std::string default_model;  // "" = the only model served
  absl::Duration request_timeout = absl::Minutes(10);
  int threads = 16;                                  // concurrent requests (each waits for its decode)
  int64_t max_request_bytes = int64_t{64} << 20;     // body size
  int64_t max_output_bytes = int64_t{512} << 20;     // one reply
};

class HttpEndpoint {
 public:
  // Binds and starts serving. `serving` says whether the server as a whole
  // takes requests (not draining, a group ready).
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options, DecodeService& service,
                                                             ModelCatalog& catalog, std::function<bool()> serving);
  ~HttpEndpoint();  // Stop()

  int port() const { return port_; }
  // Stops listening and waits for requests in flight (they finish: the
  // service's drain decides how long they may take).
  void Stop();

 private:
  HttpEndpoint() = default;

  HttpEndpointOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace vaedecode::server
