#pragma once

// gRPC's own count of the calls this process served, from its channelz
// records, as vaedecode_grpc_calls_total{outcome="started|succeeded|failed"}.
// A call that fails before any handler runs — its deadline expired while its
// message was still arriving, or gRPC reset it (the resource quota) — is in
// these and in no vaedecode_requests_total: the difference is what the
// handlers never saw.
//
// Thread-safe: Collect reads gRPC's records at each scrape.

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace vaedecode::server {

class GrpcCallCounts : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace vaedecode::server
