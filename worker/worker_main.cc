// vaedecode_worker: one rank of a worker group, started and supervised by
// vaedecode_server. Loads the models, joins the group's communicator; the
// leader (rank 0) then serves the server on a Unix socket, the peers follow
// the leader's jobs. Exits 0 after a shutdown, non-zero when the group fails
// (the server then rebuilds the group).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <ATen/Parallel.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "device/compute_device.h"
#include "device/counting_cpu_allocator.h"
#include "device/device_memory.h"
#include "families/status_error.h"
#include "parallel/gloo_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/store.h"
#include "rpc/status_macros.h"
#include "tiling/calibration.h"
#include "worker/decode_job.h"
#include "worker/group_recovery.h"
#include "worker/group_runtime.h"
#include "worker/leader_service.h"
#include "worker/model_repository.h"
#include "worker/runtime_info.h"

ABSL_FLAG(int, rank, 0, "this process's rank in its group");
ABSL_FLAG(int, world, 1, "ranks in the group");
ABSL_FLAG(std::string, group, "g0", "group name, unique per incarnation (no '/')");
ABSL_FLAG(int, store_port, 0, "TCPStore port on 127.0.0.1 (rank 0 hosts it); unused at world size 1");
ABSL_FLAG(std::string, socket, "", "leader only: Unix socket path to serve the server on");
ABSL_FLAG(std::string, model_repository, "", "folder of diffusers VAE folders; empty: the embedded default");
ABSL_FLAG(std::string, device, "cpu:0", "device: cpu:N, or cuda:N (a --config=gpu build with a CUDA LibTorch)");
ABSL_FLAG(std::string, dtype, "float32", "float32 or bfloat16 (float16 needs a GPU)");
ABSL_FLAG(int, threads, 1, "intra-op threads per rank");
ABSL_FLAG(int, collective_timeout_s, 300, "bound on every collective (a rank stuck longer fails the group)");
ABSL_FLAG(int, heartbeat_s, 10, "idle leader heartbeat period (a no-op job through the group's collectives)");
ABSL_FLAG(int, heartbeat_fd, -1,
          "descriptor of the server's heartbeat pipe: a thread of its own writes a byte to it every 250 ms, so the "
          "server sees a hung or stopped process within seconds; -1: none");
ABSL_FLAG(int64_t, memory_budget_mib, 0,
          "bytes this rank may allocate on its device (the scheduler's free memory; above it allocations fail "
          "with an out-of-memory); 0 = CPU: unbounded, GPU: the whole device");
ABSL_FLAG(std::string, profile_dir, "",
          "where measured decode-peak profiles are cached (default ~/.cache/vaedecode/profiles)");

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// The server's liveness signal (server/rank_heartbeats.h): its own thread,
// so a long op or a blocked collective does not silence it; only a process
// that stops running does. Never joined: it ends with the process.
void StartServerHeartbeat(int fd) {
  if (fd < 0) return;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);  // a full pipe drops a beat, never blocks
  std::thread([fd] {
    while (true) {
      const char beat = 'h';
      if (write(fd, &beat, 1) < 0 && errno != EAGAIN && errno != EINTR) return;  // the server is gone
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }).detach();
}

// Ends a rank after an orderly shutdown (the group's shutdown job went to
// every peer): the logs are flushed, and the process exits without running
// the destructors of the communicator, its store and LibTorch, whose
// teardown (c10d's store waits on its event loop, Gloo on its pairs) can
// stall for seconds on a loaded machine while nothing is left to release
// that the kernel does not.
[[noreturn]] void ExitAfterShutdown(int code) {
  spdlog::shutdown();
  std::fflush(nullptr);
  std::_Exit(code);
}

int Fail(const absl::Status& status) {
  spdlog::error("worker rank {} group {}: {}", absl::GetFlag(FLAGS_rank), absl::GetFlag(FLAGS_group),
                status.ToString());
  return 1;
}

}  // namespace

// The group's communicator, Gloo between CPU workers, NCCL between GPUs, and
// (several ranks) what re-forms it in place after an out-of-memory: both join
// through one store that rank 0 hosts for the process's life.
struct JoinedGroup {
  std::unique_ptr<vaedecode::parallel::Communicator> comm;
  std::unique_ptr<vaedecode::worker::GroupRecovery> recovery;
};

absl::StatusOr<JoinedGroup> JoinGroup(const c10::Device& device) {
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  c10::intrusive_ptr<c10d::Store> store;
  if (world > 1) {
    vaedecode::parallel::TcpStoreOptions store_options;
    store_options.port = absl::GetFlag(FLAGS_store_port);
    store_options.is_master = rank == 0;
    store_options.timeout = timeout;
    ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> tcp, vaedecode::parallel::ConnectTcpStore(store_options));
    store = std::move(tcp);
  }
  auto connect = [device, rank, world, timeout, store](
                     const std::string& name) -> absl::StatusOr<std::unique_ptr<vaedecode::parallel::Communicator>> {
    if (device.is_cuda()) {
      vaedecode::parallel::NcclOptions options;
      options.rank = rank;
      options.world_size = world;
      options.device = device.index();
      options.group_name = name;
      options.store = store;
      options.timeout = timeout;
      return vaedecode::parallel::NcclCommunicator::Create(options);
    }
    vaedecode::parallel::GlooOptions options;
    options.rank = rank;
    options.world_size = world;
    options.group_name = name;
    options.store = store;
    options.timeout = timeout;
    return vaedecode::parallel::GlooCommunicator::Create(options);
  };
  auto recovery = std::make_unique<vaedecode::worker::GroupRecovery>(store, absl::GetFlag(FLAGS_group), rank, world,
                                                                     timeout, connect);
  ASSIGN_OR_RETURN(std::unique_ptr<vaedecode::parallel::Communicator> comm, recovery->ConnectFirst());
  JoinedGroup joined{std::move(comm), nullptr};
  if (world > 1) joined.recovery = std::move(recovery);
  return joined;
}

int main(int argc, char** argv) {
  // Before any tensor exists, so that every CPU allocation is counted.
  vaedecode::device::CountingCpuAllocator::Install();
  absl::ParseCommandLine(argc, argv);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);  // a write to a closed pipe or socket is an error, not death
  StartServerHeartbeat(absl::GetFlag(FLAGS_heartbeat_fd));
  const int rank = absl::GetFlag(FLAGS_rank);
  absl::StatusOr<c10::Device> device = vaedecode::device::ParseComputeDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Fail(device.status());
  if (absl::Status ready = vaedecode::device::PrepareComputeDevice(*device); !ready.ok()) return Fail(ready);
  absl::StatusOr<vaedecode::device::DeviceMemory*> memory = vaedecode::device::InstallDeviceMemory(*device);
  if (!memory.ok()) return Fail(memory.status());
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  absl::StatusOr<at::ScalarType> dtype = vaedecode::families::ParseDtype(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(dtype.status());

  absl::StatusOr<vaedecode::worker::LoadedRepository> repo =
      vaedecode::worker::LoadRepository(absl::GetFlag(FLAGS_model_repository), *dtype);
  if (!repo.ok()) return Fail(repo.status());
  if (absl::GetFlag(FLAGS_rank) == 0) {  // every rank loads the same folder: say it once
    for (const std::string& w : repo->warnings) spdlog::warn("model config: {}", w);
  }
  if (!device->is_cpu()) {
    absl::Status moved = vaedecode::worker::CatchExceptions("moving the weights to the GPU", [&] {
      for (vaedecode::worker::NamedModel& m : repo->models) m.decoder->ToDevice(*device);
    });
    if (!moved.ok()) return Fail(moved);
  }

  // Measured decode peaks, before the budget applies (calibration decodes).
  vaedecode::device::DeviceMemory& meter = **memory;
  const vaedecode::tiling::PeakProbe probe = vaedecode::tiling::ProbeOf(meter);
  const std::vector<int64_t> sides = vaedecode::tiling::CalibrationSides(*device);
  std::string profile_dir = absl::GetFlag(FLAGS_profile_dir);
  if (profile_dir.empty()) profile_dir = vaedecode::tiling::DefaultProfileDir();
  // A model whose calibration decode fails is unavailable, not the worker.
  // Every rank calibrates the same models the same way, so all drop it. The
  // server logs the unavailable models once, from the leader's Models.
  std::vector<vaedecode::tiling::PeakProfile> profiles;
  std::vector<vaedecode::worker::NamedModel> calibrated;
  std::string cache_warning;  // said once, not per model
  for (vaedecode::worker::NamedModel& m : repo->models) {
    absl::StatusOr<vaedecode::tiling::PeakProfile> profile;
    const absl::Status caught = vaedecode::families::CatchExceptions("calibration", [&] {
      profile = vaedecode::tiling::LoadOrCalibrate(*m.decoder, probe, sides, meter.backend(), profile_dir,
                                                   rank == 0 ? &cache_warning : nullptr);
    });
    if (!caught.ok()) profile = caught;
    if (!profile.ok()) {
      const std::string reason = absl::StrCat("measuring its decode peaks: ", profile.status().message());
      repo->unavailable.push_back({m.name, reason});
      continue;
    }
    profiles.push_back(*profile);
    calibrated.push_back(std::move(m));
  }
  if (!cache_warning.empty()) spdlog::warn("{} (--profile_dir): each start recalibrates", cache_warning);
  if (calibrated.empty()) return Fail(absl::InvalidArgumentError("no model could be calibrated"));
  repo->models = std::move(calibrated);
  if (absl::GetFlag(FLAGS_memory_budget_mib) > 0) {
    if (absl::Status s = meter.SetBudget(absl::GetFlag(FLAGS_memory_budget_mib) << 20); !s.ok()) return Fail(s);
  }

  absl::StatusOr<JoinedGroup> group = JoinGroup(*device);
  if (!group.ok()) return Fail(group.status());
  // Calibration's decodes made the library handles, the communicator its
  // buffers: what the process holds outside tensors is known now.
  meter.MeasureMemoryOutsideTensors();

  vaedecode::worker::GroupRuntime runtime(std::move(group->comm), std::move(repo->models),
                                          absl::Seconds(absl::GetFlag(FLAGS_heartbeat_s)), std::move(group->recovery));
  if (rank != vaedecode::worker::kLeader) {
    absl::Status served = runtime.ServeAsPeer();
    if (!served.ok()) return Fail(served);
    ExitAfterShutdown(0);
  }

  const std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) return Fail(absl::InvalidArgumentError("the leader needs --socket"));
  vaedecode::worker::LeaderService service(runtime, *dtype, std::move(profiles), std::move(repo->unavailable));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail(absl::UnavailableError(absl::StrCat("cannot serve on unix:", socket)));
  spdlog::info("worker group {} leader ready: {} rank(s) on {}, {} model(s), socket {}, {}", absl::GetFlag(FLAGS_group),
               absl::GetFlag(FLAGS_world), meter.backend(), runtime.models().size(), socket,
               vaedecode::worker::LibTorchSummary());

  while (!g_stop && !runtime.broken()) absl::SleepFor(absl::Milliseconds(50));
  const bool broken = runtime.broken();
  // The server stops the leader only when it is done with the group: a
  // call still open is not waited for long.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  runtime.Shutdown();
  if (broken) return 1;
  ExitAfterShutdown(0);
}
