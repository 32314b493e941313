#include "server/grpc_call_counts.h"

#include <grpc/grpc.h>
#include <grpc/support/alloc.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

namespace vaedecode::server {
namespace {

// channelz writes int64 counts as JSON strings (proto3's mapping), and
// leaves out the ones that are 0.
double Count(const nlohmann::json& data, const char* field) {
  const auto it = data.find(field);
  if (it == data.end()) return 0;
  if (it->is_string()) return std::strtod(it->get<std::string>().c_str(), nullptr);
  return it->is_number() ? it->get<double>() : 0;
}

}  // namespace

std::vector<prometheus::MetricFamily> GrpcCallCounts::Collect() const {
  double started = 0, succeeded = 0, failed = 0;
  char* text = grpc_channelz_get_servers(0);
  if (text != nullptr) {
    const nlohmann::json servers = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    gpr_free(text);
    if (servers.is_object() && servers.contains("server") && servers["server"].is_array()) {
      for (const nlohmann::json& server : servers["server"]) {
        if (!server.is_object() || !server.contains("data")) continue;
        const nlohmann::json& data = server["data"];
        started += Count(data, "callsStarted");
        succeeded += Count(data, "callsSucceeded");
        failed += Count(data, "callsFailed");
      }
    }
  }
  prometheus::MetricFamily family;
  family.name = "vaedecode_grpc_calls_total";
  family.help =
      "gRPC's own count of the calls this server took (every service), by outcome; calls that failed before any "
      "handler ran (a deadline that expired during the upload, a stream reset by --grpc_memory_mib) are in these "
      "and in no vaedecode_requests_total";
  family.type = prometheus::MetricType::Counter;
  for (const auto& [outcome, value] :
       {std::pair<const char*, double>{"started", started}, {"succeeded", succeeded}, {"failed", failed}}) {
    prometheus::ClientMetric metric;
    metric.label.push_back({"outcome", outcome});
    metric.counter.value = value;
    family.metric.push_back(metric);
  }
  return {family};
}

}  // namespace vaedecode::server
