#include "server/port_counts.h"

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

// One family of one unlabelled sample.
prometheus::MetricFamily Single(const char* name, const char* help, prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Gauge) {
    metric.gauge.value = value;
  } else {
    metric.counter.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> PortCounts::Collect() const {
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
  prometheus::MetricFamily calls;
  calls.name = "vaedecode_grpc_calls_total";
  calls.help =
      "gRPC's own count of the calls this server took (every service), by outcome; calls that failed before any "
      "handler ran (a deadline that expired during the upload, a stream reset by --grpc_memory_mib) are in these "
      "and in no vaedecode_requests_total";
  calls.type = prometheus::MetricType::Counter;
  for (const auto& [outcome, value] :
       {std::pair<const char*, double>{"started", started}, {"succeeded", succeeded}, {"failed", failed}}) {
    prometheus::ClientMetric metric;
    metric.label.push_back({"outcome", outcome});
    metric.counter.value = value;
    calls.metric.push_back(metric);
  }
  std::vector<prometheus::MetricFamily> out = {
      calls, Single("vaedecode_grpc_connections_shed_total",
                    "Connections the gRPC port closed at once because no file descriptor was free",
                    prometheus::MetricType::Counter, static_cast<double>(grpc_.shed()))};
  if (uploads_ != nullptr) {
    out.push_back(Single("vaedecode_grpc_uploads_cut_total",
                         "gRPC connections closed because a request was still arriving after --upload_timeout_s",
                         prometheus::MetricType::Counter, static_cast<double>(uploads_->cut())));
  }
  if (http_ != nullptr) {
    out.push_back(Single("vaedecode_http_connections", "HTTP connections being served", prometheus::MetricType::Gauge,
                         http_->active_connections()));
    out.push_back(Single("vaedecode_http_connections_refused_total",
                         "HTTP connections refused (503) because the port served its most connections",
                         prometheus::MetricType::Counter, static_cast<double>(http_->refused_connections())));
  }
  return out;
}

}  // namespace vaedecode::server
