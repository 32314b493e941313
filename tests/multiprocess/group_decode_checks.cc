#include "tests/multiprocess/group_decode_checks.h"

#include <atomic>
#include <iostream>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/builtin_families.h"
#include "formats/tensor_file.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "worker/decode_job.h"
#include "worker/group_decode.h"
#include "worker/group_job.h"

namespace vaedecode::testing {

absl::StatusOr<std::unique_ptr<parallel::Communicator>> JoinTestGroup(int rank, int world, int port,
                                                                      const std::string& group) {
  parallel::GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_port = port;
  o.group_name = group;
  o.timeout = absl::Seconds(30);
  return parallel::GlooCommunicator::Create(o);
}

absl::StatusOr<std::unique_ptr<families::Decoder>> LoadFixtureDecoder(const std::string& fixture,
                                                                      at::ScalarType dtype) {
  families::LoadOptions options;
  options.dtype = dtype;
  return families::BuiltinFamilies().Load(FixturePath(fixture), options);
}

absl::StatusOr<at::Tensor> LeaderLatent(const std::string& file, int rank) {
  if (rank != worker::kLeader) return at::Tensor();
  return formats::ReadTensorFile(file, "latent");
}

absl::StatusOr<at::Tensor> LeaderLatent(const std::string& file, int rank, const families::Decoder& decoder) {
  ASSIGN_OR_RETURN(at::Tensor latent, LeaderLatent(file, rank));
  return latent.defined() ? InFamilyRank(latent, decoder.info().is_video) : latent;
}

absl::StatusOr<worker::GroupDecodeResult> PlanAndExecute(families::Decoder& decoder,
                                                         parallel::Communicator& broadcast_on,
                                                         parallel::Communicator& execute_on,
                                                         const worker::DecodeJob& leader_job) {
  worker::GroupJob job;
  if (broadcast_on.rank() == worker::kLeader) {
    worker::PlanningContext planning;
    planning.world_size = broadcast_on.world_size();
    ASSIGN_OR_RETURN(worker::DecodePlan plan, worker::PlanDecode(decoder, leader_job, planning));
    job.plan = std::move(plan);
  }
  ASSIGN_OR_RETURN(worker::GroupJob shared,
                   worker::BroadcastJob(broadcast_on, broadcast_on.rank() == worker::kLeader ? &job : nullptr));
  return worker::ExecutePlan(decoder, execute_on, shared.plan);
}

absl::StatusOr<GroupDecodeCheck> DecodeWithGroupAndCheck(families::Decoder& decoder, parallel::Communicator& comm,
                                                         const at::Tensor& latent, const GroupCheckOptions& options) {
  const worker::DecodeJob input{latent, options.space};
  parallel::CountingCommunicator counting(comm);
  ASSIGN_OR_RETURN(worker::GroupDecodeResult result, PlanAndExecute(decoder, comm, counting, input));
  const std::string want_mode =
      !options.want_mode.empty() ? options.want_mode : (comm.world_size() > 1 ? "exact" : "dense");
  const std::string mode = worker::ModeName(result.mode);
  if (mode != want_mode) {
    return absl::InternalError(absl::StrCat(options.what, ": mode ", mode, " (", result.reason, "), want ", want_mode));
  }
  GroupDecodeCheck out{counting.stats(), mode, result.sample};
  if (comm.rank() != worker::kLeader) {
    if (result.sample.defined()) return absl::InternalError("a peer kept decoded rows");
    return out;
  }
  families::DenseOps dense;
  ASSIGN_OR_RETURN(at::Tensor reference, worker::RunDecode(decoder, input, dense));
  const std::string where = absl::StrCat(options.what, " at world size ", comm.world_size(), " (", mode, ")");
  RETURN_IF_ERROR(
      parallel::testing::ExpectTensorClose(result.sample, reference, options.exact_vs_dense, 0, where + " vs dense"));
  std::cout << where << ": max abs error vs dense " << parallel::testing::MaxAbsError(result.sample, reference);
  if (!options.expected_file.empty()) {
    ASSIGN_OR_RETURN(at::Tensor expected_file, formats::ReadTensorFile(options.expected_file, "sample"));
    const at::Tensor expected = InFamilyRank(expected_file, decoder.info().is_video);
    // diffusers' output is float32; a bf16 decode is compared in float32.
    RETURN_IF_ERROR(parallel::testing::ExpectTensorClose(result.sample.to(expected.scalar_type()), expected,
                                                         options.vs_diffusers, 0, where + " vs diffusers"));
    std::cout << ", vs diffusers "
              << parallel::testing::MaxAbsError(result.sample.to(expected.scalar_type()), expected);
  }
  std::cout << "\n";
  return out;
}

absl::Status CheckFixtureCase(const FixtureCase& c, int rank, int world, int port, const std::string& group,
                              GroupCheckOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixtureDecoder(c.fixture));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, JoinTestGroup(rank, world, port, group));
  options.expected_file = c.expected_file;
  for (const bool raw : {false, true}) {
    const std::string& file = raw ? c.pipeline_latent_file : c.latent_file;
    if (file.empty()) continue;
    ASSIGN_OR_RETURN(at::Tensor latent, LeaderLatent(file, rank, *decoder));
    options.space = raw ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
    options.what = absl::StrCat(c.fixture, "/", c.name, raw ? " (raw)" : "");
    ASSIGN_OR_RETURN(GroupDecodeCheck checked, DecodeWithGroupAndCheck(*decoder, *comm, latent, options));
  }
  return absl::OkStatus();
}

std::string FixtureCaseName(const FixtureCase& c, int world) {
  return absl::StrCat(c.fixture, "_", c.name, "_ws", world);
}

std::vector<FixtureCaseAtWorld> FixtureCasesAtWorldSizes(const std::vector<std::string>& classes) {
  std::vector<FixtureCaseAtWorld> params;
  for (const FixtureCase& c : FixtureCases(classes)) {
    for (int world = 1; world <= 4; ++world) params.emplace_back(c, world);
  }
  return params;
}

std::string FixtureCaseAtWorldName(const ::testing::TestParamInfo<FixtureCaseAtWorld>& info) {
  return FixtureCaseName(std::get<0>(info.param), std::get<1>(info.param));
}

absl::Status RunFixtureCaseOnGroup(const FixtureCaseAtWorld& param, const std::string& group,
                                   const GroupCheckOptions& options, absl::Duration timeout) {
  const auto& [c, world] = param;
  return parallel::testing::RunRanks(
      world,
      [&c = c, &group, &options](int rank, int w, int port) {
        return CheckFixtureCase(c, rank, w, port, group, options);
      },
      timeout);
}

std::string WantModeForRows(const FixtureCase& c, int world) {
  absl::StatusOr<at::Tensor> latent = formats::ReadTensorFile(c.latent_file, "latent");
  if (!latent.ok()) return "unreadable latent";
  return world > 1 && latent->size(-2) < world ? "dense" : "";
}

absl::Status CheckCollectives(const parallel::CommStats& stats, const ExpectedCollectives& want, int world,
                              const std::string& what) {
  const bool sharded = world > 1;
  const int64_t total = sharded ? want.total() : 0;
  if (stats.collectives() != total || stats.ForKind(parallel::CallKind::kHalo).calls != (sharded ? want.halo : 0) ||
      stats.ForKind(parallel::CallKind::kGroupNormStats).calls != (sharded ? want.group_norm : 0) ||
      stats.ForKind(parallel::CallKind::kAttentionKV).calls != (sharded ? want.attention_kv : 0)) {
    return absl::InternalError(absl::StrCat(what, " at world size ", world, ": ", stats.collectives(),
                                            " collectives, want ", total, ": ", stats.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckSyntheticDecodes(const std::string& fixture, const std::vector<SyntheticDecode>& decodes, int rank,
                                   int world, int port, const std::string& group, GroupCheckOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixtureDecoder(fixture));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, JoinTestGroup(rank, world, port, group));
  for (size_t i = 0; i < decodes.size(); ++i) {
    at::Tensor latent;
    if (rank == worker::kLeader) {
      at::manual_seed(41 + static_cast<uint64_t>(i));
      latent = at::randn(decodes[i].shape);
    }
    options.what = absl::StrCat(fixture, " latent [", absl::StrJoin(decodes[i].shape, ", "), "]");
    ASSIGN_OR_RETURN(GroupDecodeCheck checked, DecodeWithGroupAndCheck(*decoder, *comm, latent, options));
    RETURN_IF_ERROR(CheckCollectives(checked.stats, decodes[i].collectives, world, options.what));
  }
  return absl::OkStatus();
}

absl::StatusOr<parallel::CommStats> DecodeCancelledFromTheStart(const std::string& fixture,
                                                                const std::vector<int64_t>& shape, int rank, int world,
                                                                int port, const std::string& group,
                                                                GroupCheckOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixtureDecoder(fixture));
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, JoinTestGroup(rank, world, port, group));
  at::manual_seed(41);
  const at::Tensor latent = at::randn(shape);  // the same on every rank
  std::atomic<bool> cancelled{true};
  worker::GroupDecodeOptions cancel;
  if (rank == worker::kLeader) cancel.cancelled = &cancelled;
  parallel::CountingCommunicator counting(*comm);
  absl::StatusOr<worker::GroupDecodeResult> stopped =
      worker::DecodeWithGroup(*decoder, counting, worker::DecodeJob{latent}, cancel);
  if (stopped.ok() || stopped.status().code() != absl::StatusCode::kCancelled) {
    return absl::InternalError(absl::StrCat("rank ", rank, " was not cancelled: ", stopped.status().ToString()));
  }
  const parallel::CommStats stats = counting.stats();
  options.what = absl::StrCat(fixture, " latent [", absl::StrJoin(shape, ", "), "] after a cancelled decode");
  ASSIGN_OR_RETURN(GroupDecodeCheck next, DecodeWithGroupAndCheck(*decoder, *comm, latent, options));
  return stats;
}

absl::Status CheckSyntheticDecodes(const std::string& fixture, const std::vector<std::vector<int64_t>>& shapes,
                                   const ExpectedCollectives& per_decode, int rank, int world, int port,
                                   const std::string& group, GroupCheckOptions options) {
  std::vector<SyntheticDecode> decodes;
  for (const std::vector<int64_t>& shape : shapes) decodes.push_back({shape, per_decode});
  return CheckSyntheticDecodes(fixture, decodes, rank, world, port, group, std::move(options));
}

}  // namespace vaedecode::testing
