#pragma once

// The HTTP endpoint (--http_listen), in the server process, on cpp-httplib.
// Two protocols, both feeding the same admission, queue, limits, deadlines,
// metrics and request log line as the gRPC Decode
// (DecodeService::StartCollected):
//
// diffusers' remote_decode() (server/remote_decode.h; protocol "http"):
//   POST /               decode with the default model (--http_default_model,
//                        or the only model served)
//   POST /models/NAME[/] decode with model NAME
//   POST /encode, /models/NAME/encode[/]: diffusers' remote_encode()
//                        (server/remote_encode.h), through the same path as
//                        the gRPC Encode
//   GET  /health         "Ok" while the model (any model for /health) is
//   GET  /health/NAME    served and the server is not draining; 503 otherwise
//
// The Open Inference Protocol's HTTP/REST binding (server/oip_rest.h, with
// the answers of server/oip_answers.h; protocol "oip_http"), for
// tritonclient.http and Triton's probes. M = /v2/models/NAME[/versions/1]:
//   GET  /v2/health/live, /v2/health/ready, /v2 (server metadata)
//   GET  M, M/ready, M/config, M/stats, /v2/models/stats
//   POST M/infer (JSON tensors, or Triton's binary tensor extension)
//   POST /v2/repository/index
// Other /v2 paths (model load/unload, shared memory, trace, logging) answer
// 501 naming what is served.
//
// A POST body is read as raw bytes whatever its Content-Type (a multipart
// form is refused with 415); a served path asked with another method is 405
// with Allow. A decode's deadline is --http_request_timeout_s from its
// arrival, and it is cancelled when its client closes the connection.
// Connections, and the time a request and its reply may take on the wire,
// are bounded by server/bounded_http_server.h.
// Threading: requests run on the library's thread pool; Stop from the owner.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/bounded_http_server.h"
#include "server/decode_service.h"
#include "server/model_catalog.h"
#include "server/oip_answers.h"

namespace vaedecode::server {

struct HttpEndpointOptions {
  std::string listen;         // HOST:PORT (port 0: any free port)
  std::string default_model;  // "" = the only model served
  absl::Duration request_timeout = absl::Minutes(10);
  HttpConnectionLimits connections;               // each connection holds a thread, also while its request waits
  int64_t max_request_bytes = int64_t{64} << 20;  // body size
  int64_t max_output_bytes = int64_t{512} << 20;  // one reply (remote_decode and OIP infer)
};

class HttpEndpoint {
 public:
  // Binds and starts serving. `serving` says whether the server as a whole
  // takes requests (not draining, a group ready).
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options, DecodeService& service,
                                                             ModelCatalog& catalog, const OipAnswers& oip,
                                                             std::function<bool()> serving);
  ~HttpEndpoint();  // Stop()

  int port() const { return port_; }
  int active_connections() const { return http_->active_connections(); }
  int64_t refused_connections() const { return http_->refused_connections(); }
  // Stops listening and waits for requests in flight (they finish: the
  // service's drain decides how long they may take).
  void Stop();

 private:
  HttpEndpoint() = default;

  HttpEndpointOptions options_;
  std::unique_ptr<BoundedHttpServer> http_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace vaedecode::server
