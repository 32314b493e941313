#include "server/worker_group.h"

#include <algorithm>

#include <grpcpp/grpcpp.h>

#include "vaedecode/internal/worker.grpc.pb.h"

namespace vaedecode::server {
namespace {

using worker_group_internal::SetDeadline;

constexpr absl::Duration kStatusDeadline = absl::Seconds(2);

}  // namespace

bool GroupState::SleepUnlessStopping(absl::Duration d) {
  absl::MutexLock lock(&mu);
  mu.AwaitWithTimeout(absl::Condition(&stopping), d);
  return !stopping;
}

void GroupState::RefreshMemory(const LeaderConnection& leader) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Now() + kStatusDeadline);
  internal::StatusResponse status;
  if (!leader.stub->Status(&ctx, internal::StatusRequest(), &status).ok()) return;
  int64_t capacity = -1;
  for (int64_t c : status.capacity_bytes_per_rank()) {
    if (c >= 0) capacity = capacity < 0 ? c : std::min(capacity, c);
  }
  {
    absl::MutexLock lock(&mu);
    capacity_bytes_per_rank = capacity;
  }
  // Ranks report what they can measure; missing figures leave the gauges as they are.
  for (size_t r = 0; r < options.devices.size(); ++r) {
    if (r < static_cast<size_t>(status.free_bytes_per_rank_size())) {
      metrics.SetDeviceFreeBytes(options.name, options.devices[r], status.free_bytes_per_rank(r));
    }
    if (r < static_cast<size_t>(status.peak_bytes_per_rank_size())) {
      metrics.SetDevicePeakBytes(options.name, options.devices[r], status.peak_bytes_per_rank(r));
    }
  }
}

WorkerGroup::WorkerGroup(WorkerGroupOptions options, Scheduler& scheduler, ModelCatalog& catalog,
                         ServerMetrics& metrics)
    : state_(std::move(options), scheduler, catalog, metrics) {}

WorkerGroup::~WorkerGroup() { Stop(); }

int64_t WorkerGroup::capacity_bytes_per_rank() const {
  absl::MutexLock lock(&state_.mu);
  return state_.capacity_bytes_per_rank;
}

void WorkerGroup::Start() {
  state_.metrics.SetGroupReady(state_.options.name, false);
  state_.metrics.InitGroup(state_.options.name);
  supervisor_thread_ = std::thread([this] { supervisor_.Run(); });
  dispatcher_thread_ = std::thread([this] { dispatcher_.Run(); });
}

void WorkerGroup::Stop() {
  {
    absl::MutexLock lock(&state_.mu);
    state_.stopping = true;
    if (state_.running != nullptr) state_.running->TryCancel();
  }
  if (supervisor_thread_.joinable()) supervisor_thread_.join();
  if (dispatcher_thread_.joinable()) dispatcher_thread_.join();
}

bool WorkerGroup::ready() const {
  absl::MutexLock lock(&state_.mu);
  return state_.phase == GroupState::Phase::kReady;
}

bool WorkerGroup::busy() const {
  absl::MutexLock lock(&state_.mu);
  return state_.busy;
}

}  // namespace vaedecode::server
