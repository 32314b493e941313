#include "cli/group_mode.h"

#include <unistd.h>

#include <optional>

#include <ATen/Parallel.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/model_loading.h"
#include "device/counting_cpu_allocator.h"
#include "device/device_memory.h"
#include "parallel/gloo_communicator.h"
#include "rpc/free_port.h"
#include "rpc/status_macros.h"

namespace vaedecode::cli {
namespace {

absl::StatusOr<int> IntFlag(const ParsedArgs& args, const char* name) {
  std::optional<std::string> v = args.Get(name);
  int out = 0;
  if (!v || !absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat("rank: --", name, " must be an integer"));
  }
  return out;
}

// Idle leaders heartbeat well within the peers' collective timeout.
absl::Duration HeartbeatPeriod(absl::Duration timeout) { return std::min(absl::Seconds(10), timeout / 3); }

absl::StatusOr<std::unique_ptr<parallel::Communicator>> JoinLocalGroup(int rank, int world, int port,
                                                                       const std::string& group,
                                                                       absl::Duration timeout) {
  parallel::GlooOptions options;
  options.rank = rank;
  options.world_size = world;
  options.group_name = group;
  options.store_port = port;
  options.timeout = timeout;
  return parallel::GlooCommunicator::Create(options);
}

}  // namespace

LocalGroup::LocalGroup(GroupLaunch launch, std::vector<rpc::ChildProcess> children,
                       std::unique_ptr<worker::GroupRuntime> runtime)
    : launch_(std::move(launch)), children_(std::move(children)), runtime_(std::move(runtime)) {}

LocalGroup::~LocalGroup() {
  runtime_.reset();  // stops the heartbeat thread before the children go
  for (rpc::ChildProcess& child : children_) child.Kill();
}

absl::StatusOr<std::unique_ptr<LocalGroup>> LocalGroup::Start(const GroupLaunch& launch, worker::NamedModel model) {
  // Held until this process (rank 0) has joined, so its store listens on it.
  std::optional<rpc::ReservedPort> reserved;
  if (launch.ranks > 1) {
    ASSIGN_OR_RETURN(reserved, rpc::ReservedPort::Take());
  }
  const int port = reserved ? reserved->port() : 0;
  const std::string group = absl::StrCat("cli-", getpid());
  const std::string self = rpc::SelfExecutable();

  std::vector<rpc::ChildProcess> children;
  for (int r = 1; r < launch.ranks; ++r) {
    std::vector<std::string> argv = {self,
                                     "rank",
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--world=", launch.ranks),
                                     absl::StrCat("--store-port=", port),
                                     absl::StrCat("--group=", group),
                                     absl::StrCat("--dtype=", launch.dtype_name),
                                     absl::StrCat("--threads=", launch.threads),
                                     absl::StrCat("--timeout-s=", absl::ToInt64Seconds(launch.timeout))};
    if (!launch.model_path.empty()) argv.push_back(absl::StrCat("--model=", launch.model_path));
    if (launch.seeded_weights) argv.push_back(absl::StrCat("--seeded-weights=", *launch.seeded_weights));
    ASSIGN_OR_RETURN(rpc::ChildProcess child, rpc::ChildProcess::Spawn(argv));
    children.push_back(std::move(child));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<parallel::Communicator> comm,
      JoinLocalGroup(0, launch.ranks, port, group, launch.timeout));  // children are killed by their handles
  std::vector<worker::NamedModel> models;
  models.push_back(std::move(model));
  auto runtime =
      std::make_unique<worker::GroupRuntime>(std::move(comm), std::move(models), HeartbeatPeriod(launch.timeout));
  if (runtime->broken()) return absl::UnavailableError("the CLI's worker group failed to start");
  return std::unique_ptr<LocalGroup>(new LocalGroup(launch, std::move(children), std::move(runtime)));
}

absl::Status LocalGroup::Stop() {
  runtime_->Shutdown();
  const absl::Time deadline = absl::Now() + launch_.timeout;
  for (size_t i = 0; i < children_.size(); ++i) {
    ASSIGN_OR_RETURN(int code, children_[i].Wait(deadline));
    if (code != 0) return absl::UnavailableError(absl::StrCat("rank ", i + 1, " exited with code ", code));
  }
  return absl::OkStatus();
}

absl::Status RunRank(const ParsedArgs& args) {
  absl::StatusOr<int> rank = IntFlag(args, "rank");
  absl::StatusOr<int> world = IntFlag(args, "world");
  absl::StatusOr<int> port = IntFlag(args, "store-port");
  absl::StatusOr<int> timeout_s = IntFlag(args, "timeout-s");
  absl::StatusOr<int> threads = IntFlag(args, "threads");
  for (const auto* s : {&rank, &world, &port, &timeout_s, &threads}) {
    if (!s->ok()) return s->status();
  }
  at::set_num_threads(*threads);
  device::CountingCpuAllocator::Install();
  if (absl::StatusOr<device::DeviceMemory*> m = device::InstallDeviceMemory(c10::Device(c10::kCPU)); !m.ok()) {
    return m.status();
  }
  ASSIGN_OR_RETURN(at::ScalarType dtype, families::ParseDtype(args.Get("dtype").value_or("float32")));
  std::optional<uint64_t> seeded_weights;
  if (std::optional<std::string> s = args.Get("seeded-weights")) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(*s, &seed)) return absl::InvalidArgumentError("rank: --seeded-weights must be an integer");
    seeded_weights = seed;
  }
  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(args.Get("model"), dtype, seeded_weights));
  const absl::Duration timeout = absl::Seconds(*timeout_s);
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                   JoinLocalGroup(*rank, *world, *port, args.Get("group").value_or("cli"), timeout));
  std::vector<worker::NamedModel> models;
  models.push_back(std::move(model));
  worker::GroupRuntime runtime(std::move(comm), std::move(models), HeartbeatPeriod(timeout));
  return runtime.ServeAsPeer();
}

}  // namespace vaedecode::cli
