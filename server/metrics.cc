#include "server/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/status.h"

namespace vaedecode::server {
namespace {

using prometheus::Histogram;

// Seconds, 1 ms to ~5 min.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 300};
}

Histogram::BucketBoundaries CountBuckets() { return {0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}; }

}  // namespace

ServerMetrics::ServerMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("vaedecode_requests_total")
                    .Help("Decode requests by model and final gRPC status")
                    .Register(registry)),
      decode_(prometheus::BuildHistogram()
                  .Name("vaedecode_decode_seconds")
                  .Help("Decode time on the group (leader-measured) by family, mode and degree")
                  .Register(registry)),
      gather_(prometheus::BuildHistogram()
                  .Name("vaedecode_gather_seconds")
                  .Help("Time gathering decoded rows to the leader")
                  .Register(registry)),
      collectives_(prometheus::BuildHistogram()
                       .Name("vaedecode_collectives_per_decode")
                       .Help("Collective operations per decode (every rank meets at each)")
                       .Register(registry)),
      collective_wait_(prometheus::BuildHistogram()
                           .Name("vaedecode_collective_wait_seconds")
                           .Help("Per decode, the longest time any rank was blocked in the group's collectives")
                           .Register(registry)),
      request_seconds_(prometheus::BuildHistogram()
                           .Name("vaedecode_request_seconds")
                           .Help("Decode requests end to end, by final gRPC status")
                           .Register(registry)),
      queue_(prometheus::BuildHistogram()
                 .Name("vaedecode_queue_seconds")
                 .Help("Time a request waited for a worker group")
                 .Register(registry)
                 .Add({}, LatencyBuckets())),
      stream_(prometheus::BuildHistogram()
                  .Name("vaedecode_stream_seconds")
                  .Help("Time from the leader's first message to the trailer being handed to the "
                        "client stream")
                  .Register(registry)
                  .Add({}, LatencyBuckets())),
      queue_depth_(prometheus::BuildGauge()
                       .Name("vaedecode_queue_depth")
                       .Help("Requests waiting for a worker group")
                       .Register(registry)
                       .Add({})),
      in_flight_(prometheus::BuildGauge()
                     .Name("vaedecode_in_flight")
                     .Help("Requests running on a worker group")
                     .Register(registry)
                     .Add({})),
      device_free_(prometheus::BuildGauge()
                       .Name("vaedecode_device_free_bytes")
                       .Help("Free memory per device, as its worker last reported")
                       .Register(registry)),
      device_peak_(prometheus::BuildGauge()
                       .Name("vaedecode_device_peak_bytes")
                       .Help("Peak memory per device, as its worker last reported")
                       .Register(registry)),
      restarts_(prometheus::BuildCounter()
                    .Name("vaedecode_worker_restarts_total")
                    .Help("Worker group rebuilds after a failure")
                    .Register(registry)),
      tile_retries_(prometheus::BuildCounter()
                        .Name("vaedecode_tile_retries_total")
                        .Help("Out-of-memory retries of tiled decodes (floor tile, then stock tiles)")
                        .Register(registry)),
      group_ready_(prometheus::BuildGauge()
                       .Name("vaedecode_group_ready")
                       .Help("1 when the worker group is formed and serving")
                       .Register(registry)),
      model_load_failed_(prometheus::BuildGauge()
                             .Name("vaedecode_model_load_failed")
                             .Help("1 while the model's folder failed to load on every group that tried it (ListModels "
                                   "and the log say why); other models are served")
                             .Register(registry)),
      success_(prometheus::BuildCounter()
                   .Name("vaedecode_request_success")
                   .Help("Successful decode requests (Triton's nv_inference_request_success)")
                   .Register(registry)),
      failure_(prometheus::BuildCounter()
                   .Name("vaedecode_request_failure")
                   .Help("Failed decode requests by reason, the gRPC status code (Triton's "
                         "nv_inference_request_failure)")
                   .Register(registry)),
      request_us_(prometheus::BuildCounter()
                      .Name("vaedecode_request_duration_us")
                      .Help("Cumulative end-to-end time of successful requests, microseconds (Triton's "
                            "nv_inference_request_duration_us)")
                      .Register(registry)),
      queue_us_(prometheus::BuildCounter()
                    .Name("vaedecode_queue_duration_us")
                    .Help("Cumulative time successful requests waited for a worker group, microseconds "
                          "(Triton's nv_inference_queue_duration_us)")
                    .Register(registry)),
      compute_us_(prometheus::BuildCounter()
                      .Name("vaedecode_compute_infer_duration_us")
                      .Help("Cumulative decode time of successful requests on their group, microseconds "
                            "(Triton's nv_inference_compute_infer_duration_us)")
                      .Register(registry)),
      pending_(prometheus::BuildGauge()
                   .Name("vaedecode_pending_request_count")
                   .Help("Requests queued for a worker group and not yet running (Triton's "
                         "nv_inference_pending_request_count)")
                   .Register(registry)),
      memory_waits_(prometheus::BuildGauge()
                        .Name("vaedecode_memory_waits")
                        .Help("Requests holding a worker group while they wait for device memory")
                        .Register(registry)
                        .Add({})),
      output_buffer_(prometheus::BuildGauge()
                         .Name("vaedecode_output_buffer_bytes")
                         .Help("Finished output held in the server until slow clients read it")
                         .Register(registry)
                         .Add({})),
      stalled_(prometheus::BuildCounter()
                   .Name("vaedecode_stalled_streams_total")
                   .Help("Calls cancelled because their client read nothing for --stream_stall_timeout_s")
                   .Register(registry)
                   .Add({})),
      cancel_release_(prometheus::BuildHistogram()
                          .Name("vaedecode_cancel_release_seconds")
                          .Help("Time from a running request's cancellation or deadline until its group "
                                "is free again")
                          .Register(registry)
                          .Add({}, LatencyBuckets())),
      rejected_(prometheus::BuildCounter()
                    .Name("vaedecode_rejected_requests_total")
                    .Help("Requests refused by size, by reason (message_too_large: over --max_message_bytes; "
                          "output_too_large: a unary reply's predicted output over its limit)")
                    .Register(registry)),
      sessions_open_(prometheus::BuildGauge()
                         .Name("vaedecode_sessions_open")
                         .Help("Streaming decode sessions (DecodeSession) open")
                         .Register(registry)
                         .Add({})),
      session_state_(prometheus::BuildGauge()
                         .Name("vaedecode_session_state_bytes")
                         .Help("Bytes the open sessions' causal decoder states hold on the workers, all ranks")
                         .Register(registry)
                         .Add({})),
      session_chunk_(prometheus::BuildHistogram()
                         .Name("vaedecode_session_chunk_seconds")
                         .Help("A session chunk's arrival to its trailer (queue, decode, stream)")
                         .Register(registry)
                         .Add({}, LatencyBuckets())),
      session_first_frame_(prometheus::BuildHistogram()
                               .Name("vaedecode_session_first_frame_seconds")
                               .Help("A session's open to its first frame sent")
                               .Register(registry)
                               .Add({}, LatencyBuckets())),
      sessions_(prometheus::BuildCounter()
                    .Name("vaedecode_sessions_total")
                    .Help("Streaming decode sessions ended, by status")
                    .Register(registry)) {
  sessions_.Add({{"status", "OK"}});
  rejected_.Add({{"reason", "message_too_large"}});
  rejected_.Add({{"reason", "output_too_large"}});
}

void ServerMetrics::RecordRequest(const std::string& model, const std::string& protocol, absl::StatusCode code,
                                  int64_t batch, double total_s, double queue_s, double decode_s) {
  const std::string status = rpc::StatusCodeName(code);
  requests_.Add({{"model", model}, {"status", status}, {"protocol", protocol}}).Increment();
  request_seconds_.Add({{"status", status}}, LatencyBuckets()).Observe(total_s);
  {
    const auto ns = [](double s) { return static_cast<uint64_t>(std::max(0.0, s) * 1e9); };
    absl::MutexLock lock(&counters_mu_);
    ModelCounters& c = counters_[model];
    if (code != absl::StatusCode::kOk) {
      ++c.failure;
      c.failure_ns += ns(total_s);
    } else {
      ++c.success;
      c.inferences += static_cast<uint64_t>(std::max<int64_t>(1, batch));
      c.success_ns += ns(total_s);
      c.queue_ns += ns(queue_s);
      c.compute_ns += ns(decode_s);
      c.last_ms = absl::ToUnixMillis(absl::Now());
    }
  }
  if (code != absl::StatusCode::kOk) {
    failure_.Add({{"model", model}, {"reason", status}}).Increment();
    return;
  }
  success_.Add({{"model", model}}).Increment();
  request_us_.Add({{"model", model}}).Increment(total_s * 1e6);
  queue_us_.Add({{"model", model}}).Increment(queue_s * 1e6);
  compute_us_.Add({{"model", model}}).Increment(decode_s * 1e6);
}

ModelCounters ServerMetrics::Counters(const std::string& model) const {
  absl::MutexLock lock(&counters_mu_);
  auto it = counters_.find(model);
  return it == counters_.end() ? ModelCounters() : it->second;
}

void ServerMetrics::AddPending(const std::string& model, int64_t delta) {
  pending_.Add({{"model", model}}).Increment(static_cast<double>(delta));
}

void ServerMetrics::RecordDecode(const std::string& model, const std::string& family, const std::string& mode,
                                 int degree, double decode_s, double gather_s, int64_t collectives,
                                 double collective_wait_s) {
  const prometheus::Labels labels = {{"family", family}, {"mode", mode}, {"degree", absl::StrCat(degree)}};
  decode_
      .Add({{"model", model}, {"family", family}, {"mode", mode}, {"degree", absl::StrCat(degree)}}, LatencyBuckets())
      .Observe(decode_s);
  gather_.Add(labels, LatencyBuckets()).Observe(gather_s);
  collectives_.Add(labels, CountBuckets()).Observe(static_cast<double>(collectives));
  collective_wait_.Add(labels, LatencyBuckets()).Observe(collective_wait_s);
}

void ServerMetrics::RecordQueueTime(double seconds) { queue_.Observe(seconds); }
void ServerMetrics::RecordStreamTime(double seconds) { stream_.Observe(seconds); }
void ServerMetrics::SetQueueDepth(int64_t depth) { queue_depth_.Set(static_cast<double>(depth)); }
void ServerMetrics::AddInFlight(int64_t delta) { in_flight_.Increment(static_cast<double>(delta)); }

void ServerMetrics::SetDeviceFreeBytes(const std::string& group, const std::string& device, int64_t bytes) {
  device_free_.Add({{"device", device}, {"group", group}}).Set(static_cast<double>(bytes));
}

void ServerMetrics::SetDevicePeakBytes(const std::string& group, const std::string& device, int64_t bytes) {
  device_peak_.Add({{"device", device}, {"group", group}}).Set(static_cast<double>(bytes));
}

void ServerMetrics::RecordWorkerRestart(const std::string& group) { restarts_.Add({{"group", group}}).Increment(); }

void ServerMetrics::InitGroup(const std::string& group) { restarts_.Add({{"group", group}}); }

void ServerMetrics::InitModel(const std::string& model) {
  tile_retries_.Add({{"model", model}});
  success_.Add({{"model", model}});
  request_us_.Add({{"model", model}});
  queue_us_.Add({{"model", model}});
  compute_us_.Add({{"model", model}});
  pending_.Add({{"model", model}});
  model_load_failed_.Add({{"model", model}}).Set(0);
}

void ServerMetrics::SetModelLoadFailed(const std::string& model, bool failed) {
  model_load_failed_.Add({{"model", model}}).Set(failed ? 1 : 0);
}

void ServerMetrics::RecordTileRetries(const std::string& model, int retries) {
  tile_retries_.Add({{"model", model}}).Increment(retries);
}

void ServerMetrics::SetGroupReady(const std::string& group, bool ready) {
  group_ready_.Add({{"group", group}}).Set(ready ? 1 : 0);
}

void ServerMetrics::AddMemoryWaits(int64_t delta) { memory_waits_.Increment(static_cast<double>(delta)); }
void ServerMetrics::SetOutputBufferBytes(int64_t bytes) { output_buffer_.Set(static_cast<double>(bytes)); }
void ServerMetrics::RecordStalledStream() { stalled_.Increment(); }
void ServerMetrics::RecordCancelRelease(double seconds) { cancel_release_.Observe(seconds); }
void ServerMetrics::RecordRejected(const std::string& reason) { rejected_.Add({{"reason", reason}}).Increment(); }
void ServerMetrics::AddSessionsOpen(int64_t delta) { sessions_open_.Increment(static_cast<double>(delta)); }
void ServerMetrics::AddSessionStateBytes(int64_t delta) { session_state_.Increment(static_cast<double>(delta)); }
void ServerMetrics::RecordSessionChunk(double seconds) { session_chunk_.Observe(seconds); }
void ServerMetrics::RecordSessionFirstFrame(double seconds) { session_first_frame_.Observe(seconds); }
void ServerMetrics::RecordSessionEnd(absl::StatusCode code) {
  sessions_.Add({{"status", rpc::StatusCodeName(code)}}).Increment();
}

}  // namespace vaedecode::server
