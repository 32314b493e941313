#pragma once

// The vaedecode server: the public gRPC services (vaedecode.v1 and the Open
// Inference Protocol, with standard health and reflection), the optional
// HTTP endpoint (diffusers' remote_decode and the OIP's HTTP/REST binding),
// the scheduler, the worker groups and the /metrics endpoint,
// wired together and torn down in order.
//
// Reflection (grpc.reflection.v1 and v1alpha) describes the public services
// only (server/public_reflection.h).
//
// Health service names: "" and "vaedecode.v1.VaeDecoder" are SERVING while
// any group is ready and the server is not draining; each model has its own
// name "vaedecode.v1.VaeDecoder/<model>", SERVING while a ready group serves
// it.
//
// Threading: Create, Drain and the destructor from one owner thread.

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/decode_service.h"
#include "server/grpc_listener.h"
#include "server/http_endpoint.h"
#include "server/metrics.h"
#include "server/model_catalog.h"
#include "server/oip_service.h"
#include "server/port_counts.h"
#include "server/public_reflection.h"
#include "server/request_validation.h"
#include "server/scheduler.h"
#include "server/upload_watchdog.h"
#include "server/worker_group.h"

namespace vaedecode::server {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";
  // TLS on the gRPC port: PEM files of the server's certificate chain and
  // key (both or neither), and optionally the CAs whose client certificates
  // are required (mutual TLS). Empty: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string model_repository;  // "" = the workers' embedded default model
  std::string devices = "cpu:1";
  int group_size = 1;
  int64_t max_queue = 64;                // waiting requests (running ones not counted); >= 1
  int64_t max_message_bytes = 64 << 20;  // largest request (latent) and response message
  // gRPC's resource quota: what its transport may hold for all calls in
  // flight (partial uploads included). 0: 4 x max_message_bytes, at least
  // 256 MiB (GrpcMemoryBytes).
  int64_t grpc_memory_mib = 0;
  std::string metrics_listen;  // "" = no /metrics endpoint
  absl::Duration drain_timeout = absl::Seconds(30);
  // Connections are closed (GOAWAY) after this age so that long-lived
  // clients reconnect and spread over replicas behind an L4 balancer;
  // calls in flight get the grace. Zero: connections live forever.
  absl::Duration max_connection_age = absl::Minutes(5);
  absl::Duration max_connection_age_grace = absl::Minutes(10);
  std::string worker_binary;  // "" = found beside the server binary
  std::string dtype = "float32";
  int threads = 1;
  int collective_timeout_s = 300;
  absl::Duration heartbeat_timeout = absl::Seconds(5);        // zero: off (see WorkerGroupOptions)
  absl::Duration cancel_release_timeout = absl::Seconds(30);  // see WorkerGroupOptions
  int64_t memory_budget_mib = 0;  // per rank; 0 = CPU: unbounded (no memory-based mode choice), GPU: whole GPU
  absl::Duration worker_start_timeout = absl::Minutes(5);
  int64_t chunk_bytes = 1 << 20;  // largest Chunk.data the leader sends
  AdmissionLimits admission;      // output pixel limits, non-finite latents
  // Finished output waiting for slow clients (see DecodeServiceOptions).
  int64_t max_call_output_bytes = int64_t{512} << 20;
  int64_t max_output_buffer_bytes = int64_t{2} << 30;
  absl::Duration stream_stall_timeout = absl::Seconds(30);
  absl::Duration stream_read_timeout = absl::Seconds(120);
  std::string socket_dir;  // "" = a fresh /tmp/vaedecode-XXXXXX
  // diffusers' remote_decode over HTTP (server/http_endpoint.h): HOST:PORT,
  // "" = off; the model of POST /; each request's deadline.
  std::string http_listen;
  std::string http_default_model;
  absl::Duration http_request_timeout = absl::Minutes(10);
  // On the wire: a request's line and headers, then its body, must arrive
  // within these (its reply gets stream_read_timeout to be read).
  absl::Duration http_header_timeout = absl::Seconds(10);
  // A gRPC request still arriving after this has its connection closed
  // (server/upload_watchdog.h); zero: off.
  absl::Duration upload_timeout = absl::Seconds(120);
  absl::Duration http_body_timeout = absl::Seconds(120);
  // DecodeSession's limits (server/session_registry.h).
  SessionLimits sessions;
};

// The bytes of gRPC's resource quota that `options` ask for.
int64_t GrpcMemoryBytes(const ServerOptions& options);

// The health service name of a model.
std::string ModelHealthName(const std::string& model);

class Server {
 public:
  // Validates the options, listens, starts the metrics endpoint and the
  // worker groups (which become ready in the background; health says when).
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();  // Drain(absl::ZeroDuration()) if not drained

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_ ? http_->port() : 0; }

  // Graceful shutdown: health NOT_SERVING, new calls UNAVAILABLE, waits up to
  // `timeout` for calls in flight (queued or running) to finish, cancels the
  // rest, stops the workers. DEADLINE_EXCEEDED (after shutting down anyway)
  // when calls had to be cancelled.
  absl::Status Drain(absl::Duration timeout);

 private:
  Server() = default;
  void UpdateHealth();
  // Queued requests for a model that no longer loads (the catalog's load
  // failures) fail now with why, not at their deadline.
  void FailQueuedForUnloadableModels();
  // Not draining, and a ready group serves some model.
  bool Serving();

  ServerOptions options_;
  std::string socket_dir_;
  bool own_socket_dir_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  bool drained_ = false;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<ModelCatalog> catalog_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<OipAnswers> oip_answers_;
  std::unique_ptr<OipService> oip_;
  std::unique_ptr<PublicSurface> surface_;
  std::unique_ptr<ReflectionV1> reflection_v1_;
  std::unique_ptr<ReflectionV1Alpha> reflection_v1alpha_;
  std::unique_ptr<UnservedMethods> unserved_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<GrpcListener> listener_;  // feeds grpc_server_: stopped first
  std::unique_ptr<UploadWatchdog> upload_watchdog_;
  std::unique_ptr<HttpEndpoint> http_;
  std::shared_ptr<PortCounts> port_counts_;       // reads listener_ and http_
  std::unique_ptr<prometheus::Exposer> exposer_;  // scrapes port_counts_: dropped first
  std::vector<std::unique_ptr<WorkerGroup>> groups_;

  absl::Mutex health_mu_;
  bool health_final_ ABSL_GUARDED_BY(health_mu_) = false;
};

// The worker binary: `flag` if set, else vaedecode_worker beside the server
// (bazel-bin/worker/ next to bazel-bin/server/, or in the runfiles).
absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag);

}  // namespace vaedecode::server
