#pragma once

// What the server's ports see, read at each scrape from their owners:
//   vaedecode_grpc_calls_total{outcome="started|succeeded|failed"}  gRPC's
//     own count of every call (its channelz records). A call that fails
//     before any handler runs — its deadline expired while its message was
//     still arriving, or the resource quota reset it — is in these and in no
//     vaedecode_requests_total: the difference is what handlers never saw.
//   vaedecode_grpc_connections_shed_total  connections the gRPC port closed
//     at once for want of a file descriptor (server/grpc_listener.h)
//   vaedecode_grpc_uploads_cut_total       connections closed because a request
//     was still arriving after --upload_timeout_s (server/upload_watchdog.h)
//   vaedecode_http_connections             HTTP connections being served
//   vaedecode_http_connections_refused_total  HTTP connections refused 503
//     beyond the bound (server/bounded_http_server.h)
// (the HTTP ones only with --http_listen).
//
// Thread-safe: Collect reads atomics and gRPC's records; the listener and
// the endpoint must outlive the scrapes (the server drops its exposer first).

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "server/grpc_listener.h"
#include "server/http_endpoint.h"
#include "server/upload_watchdog.h"

namespace vaedecode::server {

class PortCounts : public prometheus::Collectable {
 public:
  // `uploads` and `http` may be null (off).
  PortCounts(const GrpcListener& grpc, const UploadWatchdog* uploads, const HttpEndpoint* http)
      : grpc_(grpc), uploads_(uploads), http_(http) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const GrpcListener& grpc_;
  const UploadWatchdog* uploads_;
  const HttpEndpoint* http_;
};

}  // namespace vaedecode::server
