#include "cli/group_mode.h"

#include <unistd.h>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/model_loading.h"
#include "device/counting_cpu_allocator.h"
#include "device/device_memory.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"
#include "rpc/child_process.h"
#include "rpc/free_port.h"

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

}  // namespace

absl::StatusOr<LocalGroupResult> DecodeWithLocalGroup(const GroupLaunch& launch,
                                                      families::Decoder& decoder,
                                                      const worker::DecodeJob& job) {
  absl::StatusOr<int> port = launch.ranks > 1 ? rpc::PickFreePort() : absl::StatusOr<int>(0);
  if (!port.ok()) return port.status();
  const std::string group = absl::StrCat("cli-", getpid());
  const std::string self = rpc::SelfExecutable();

  std::vector<rpc::ChildProcess> children;
  for (int r = 1; r < launch.ranks; ++r) {
    std::vector<std::string> argv = {self,
                                     "rank",
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--world=", launch.ranks),
                                     absl::StrCat("--store-port=", *port),
                                     absl::StrCat("--group=", group),
                                     absl::StrCat("--dtype=", launch.dtype_name),
                                     absl::StrCat("--threads=", launch.threads),
                                     absl::StrCat("--timeout-s=", absl::ToInt64Seconds(launch.timeout))};
    if (!launch.model_path.empty()) argv.push_back(absl::StrCat("--model=", launch.model_path));
    absl::StatusOr<rpc::ChildProcess> child = rpc::ChildProcess::Spawn(argv);
    if (!child.ok()) return child.status();
    children.push_back(*std::move(child));
  }

  parallel::GlooOptions options;
  options.rank = 0;
  options.world_size = launch.ranks;
  options.group_name = group;
  options.store_port = *port;
  options.timeout = launch.timeout;
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = parallel::GlooCommunicator::Create(options);
  if (!comm.ok()) return comm.status();  // children are killed by their handles

  worker::GroupJob group_job;
  group_job.decode = job;
  absl::StatusOr<worker::GroupJob> shared = worker::BroadcastJob(**comm, &group_job);
  if (!shared.ok()) return shared.status();
  parallel::CountingCommunicator counting(**comm);
  absl::StatusOr<worker::GroupDecodeResult> result = worker::DecodeWithGroup(decoder, counting, shared->decode);
  if (!result.ok()) return result.status();
  LocalGroupResult out{*std::move(result), {}, counting.stats()};
  absl::StatusOr<std::vector<worker::RankStats>> ranks = worker::GatherRankStats(**comm, out.decode);
  if (!ranks.ok()) return ranks.status();
  out.ranks = *std::move(ranks);

  const absl::Time deadline = absl::Now() + launch.timeout;
  for (size_t i = 0; i < children.size(); ++i) {
    absl::StatusOr<int> code = children[i].Wait(deadline);
    if (!code.ok()) return code.status();
    if (*code != 0) {
      return absl::UnavailableError(absl::StrCat("rank ", i + 1, " exited with code ", *code));
    }
  }
  return out;
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
  absl::StatusOr<at::ScalarType> dtype = families::ParseDtype(args.Get("dtype").value_or("float32"));
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<LoadedModel> model = LoadModel(args.Get("model"), *dtype);
  if (!model.ok()) return model.status();

  parallel::GlooOptions options;
  options.rank = *rank;
  options.world_size = *world;
  options.group_name = args.Get("group").value_or("cli");
  options.store_port = *port;
  options.timeout = absl::Seconds(*timeout_s);
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = parallel::GlooCommunicator::Create(options);
  if (!comm.ok()) return comm.status();
  absl::StatusOr<worker::GroupJob> job = worker::BroadcastJob(**comm, nullptr);
  if (!job.ok()) return job.status();
  absl::StatusOr<worker::GroupDecodeResult> result = worker::DecodeWithGroup(*model->decoder, **comm, job->decode);
  if (!result.ok()) return result.status();
  return worker::GatherRankStats(**comm, *result).status();
}

}  // namespace vaedecode::cli
