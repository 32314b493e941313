#pragma once

// The server's Prometheus metrics, built once at start-up on the registry
// passed in (which the /metrics exposer serves). Label sets are bounded:
// model names come from the catalog ("_unknown" for names that are not),
// status is a gRPC code name, family/mode/degree come from the models and the
// fixed group size, device and group from the --devices carving.
//
//   vaedecode_requests_total{model,status,protocol}   counter (protocol: grpc, http, oip)
//   vaedecode_decode_seconds{model,family,mode,degree} histogram (leader decode time)
//   vaedecode_gather_seconds{family,mode,degree}       histogram
//   vaedecode_collectives_per_decode{family,mode,degree} histogram
//   vaedecode_collective_wait_seconds{family,mode,degree} histogram (per decode, the
//                                                      longest any rank was blocked in collectives)
//   vaedecode_queue_seconds                            histogram (time in the queue)
//   vaedecode_stream_seconds                           histogram
//   vaedecode_request_seconds{status}                  histogram (end to end)
//   vaedecode_queue_depth                              gauge
//   vaedecode_in_flight                                gauge (running on a group)
//   vaedecode_device_free_bytes{device,group}          gauge
//   vaedecode_device_peak_bytes{device,group}          gauge
//   vaedecode_worker_restarts_total{group}             counter
//   vaedecode_tile_retries_total{model}                counter (OOM-ladder fallbacks)
//   vaedecode_group_ready{group}                       gauge (1 ready, 0 not)
//   vaedecode_memory_waits                             gauge (requests holding a group while
//                                                      they wait for device memory)
//   vaedecode_output_buffer_bytes                      gauge (finished output waiting for clients)
//   vaedecode_stalled_streams_total                    counter (calls cancelled: the client stopped reading)
//   vaedecode_cancel_release_seconds                   histogram (cancel or deadline to the group's release)
//   vaedecode_grpc_calls_total{outcome}, vaedecode_grpc_connections_shed_total,
//   vaedecode_http_connections, vaedecode_http_connections_refused_total:
//                                                      what the ports see (server/port_counts.h)
//   vaedecode_sessions_open                            gauge (DecodeSession calls open)
//   vaedecode_session_state_bytes                      gauge (what open sessions' causal states hold,
//                                                      summed over ranks, as their last chunks reported)
//   vaedecode_session_chunk_seconds                    histogram (a session chunk's arrival to its
//                                                      trailer: queue, decode, stream)
//   vaedecode_session_first_frame_seconds              histogram (a session's open to its first frame sent)
//   vaedecode_sessions_total{status}                   counter (sessions ended, by gRPC code name)
//   vaedecode_rejected_requests_total{reason}          counter (message_too_large: over
//                                                      --max_message_bytes; output_too_large: a
//                                                      unary reply's predicted output over its limit)
//
// Triton's per-model names and meanings, so dashboards built for Triton
// (nv_inference_*) work with the prefix swapped:
//   vaedecode_request_success{model}                   counter
//   vaedecode_request_failure{model,reason}            counter (reason: gRPC code name)
//   vaedecode_request_duration_us{model}               counter (cumulative, successful requests)
//   vaedecode_queue_duration_us{model}                 counter (cumulative, successful requests)
//   vaedecode_compute_infer_duration_us{model}         counter (cumulative decode time, successful)
//   vaedecode_pending_request_count{model}             gauge (queued, not yet on a group)
//
// Thread-safe: prometheus-cpp metrics are atomic and families lock when a
// new label set is added; the per-model counters have a lock of their own.

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace vaedecode::server {

// Triton's per-model statistics (the OIP ModelStatistics extension), from
// the same events as the vaedecode_request_* counters.
struct ModelCounters {
  uint64_t success = 0;     // successful requests
  uint64_t failure = 0;     // failed requests (any status but OK)
  uint64_t inferences = 0;  // successful requests' batch entries
  uint64_t success_ns = 0;  // their end-to-end time
  uint64_t failure_ns = 0;
  uint64_t queue_ns = 0;    // successful requests' queue time
  uint64_t compute_ns = 0;  // successful requests' decode time on the group
  int64_t last_ms = 0;      // ms since the epoch of the last success; 0: none
};

class ServerMetrics {
 public:
  // Registers every family on `registry`, which must outlive this object.
  explicit ServerMetrics(prometheus::Registry& registry);

  // One finished request of `batch` entries; queue and decode times count
  // for successful ones.
  void RecordRequest(const std::string& model, const std::string& protocol, absl::StatusCode code, int64_t batch,
                     double total_s, double queue_s, double decode_s);
  // What RecordRequest has counted for `model` (all zero if nothing).
  ModelCounters Counters(const std::string& model) const;
  // One finished decode, from the leader's header and trailer.
  void RecordDecode(const std::string& model, const std::string& family, const std::string& mode, int degree,
                    double decode_s, double gather_s, int64_t collectives, double collective_wait_s);
  void AddPending(const std::string& model, int64_t delta);
  void RecordQueueTime(double seconds);
  void RecordStreamTime(double seconds);
  void SetQueueDepth(int64_t depth);
  void AddInFlight(int64_t delta);
  void SetDeviceFreeBytes(const std::string& group, const std::string& device, int64_t bytes);
  void SetDevicePeakBytes(const std::string& group, const std::string& device, int64_t bytes);
  void RecordWorkerRestart(const std::string& group);
  // Counters exist at 0 before their first event, so rate()/increase() see
  // the first one (Prometheus cannot count from a series that appears at 1).
  void InitGroup(const std::string& group);
  void InitModel(const std::string& model);
  // Out-of-memory retries of the tiled ladder (floor tile, then stock tiles).
  void RecordTileRetries(const std::string& model, int retries);
  void SetGroupReady(const std::string& group, bool ready);
  void SetModelLoadFailed(const std::string& model, bool failed);
  void AddMemoryWaits(int64_t delta);
  void SetOutputBufferBytes(int64_t bytes);
  void RecordStalledStream();
  void RecordCancelRelease(double seconds);
  void RecordRejected(const std::string& reason);
  void AddSessionsOpen(int64_t delta);
  void AddSessionStateBytes(int64_t delta);
  void RecordSessionChunk(double seconds);
  void RecordSessionFirstFrame(double seconds);
  void RecordSessionEnd(absl::StatusCode code);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& decode_;
  prometheus::Family<prometheus::Histogram>& gather_;
  prometheus::Family<prometheus::Histogram>& collectives_;
  prometheus::Family<prometheus::Histogram>& collective_wait_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Histogram& queue_;
  prometheus::Histogram& stream_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& in_flight_;
  prometheus::Family<prometheus::Gauge>& device_free_;
  prometheus::Family<prometheus::Gauge>& device_peak_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& tile_retries_;
  prometheus::Family<prometheus::Gauge>& group_ready_;
  prometheus::Family<prometheus::Gauge>& model_load_failed_;
  prometheus::Family<prometheus::Counter>& success_;
  prometheus::Family<prometheus::Counter>& failure_;
  prometheus::Family<prometheus::Counter>& request_us_;
  prometheus::Family<prometheus::Counter>& queue_us_;
  prometheus::Family<prometheus::Counter>& compute_us_;
  prometheus::Family<prometheus::Gauge>& pending_;
  prometheus::Gauge& memory_waits_;
  prometheus::Gauge& output_buffer_;
  prometheus::Counter& stalled_;
  prometheus::Histogram& cancel_release_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Gauge& sessions_open_;
  prometheus::Gauge& session_state_;
  prometheus::Histogram& session_chunk_;
  prometheus::Histogram& session_first_frame_;
  prometheus::Family<prometheus::Counter>& sessions_;
  mutable absl::Mutex counters_mu_;
  std::map<std::string, ModelCounters> counters_ ABSL_GUARDED_BY(counters_mu_);
};

}  // namespace vaedecode::server
