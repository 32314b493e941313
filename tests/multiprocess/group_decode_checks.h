#pragma once

// Shared pieces of the multi-process exact-decode tests: join a Gloo group,
// load a fixture's decoder, broadcast a latent from the leader, decode it
// with the group and check the leader's output against the dense decode and,
// when given, diffusers' output. For RunRanks bodies: everything returns a
// Status (gtest assertions are lost in the child processes).

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "families/decoder.h"
#include "parallel/communicator.h"
#include "parallel/counting_communicator.h"
#include "tests/fixtures/fixture_paths.h"
#include "worker/decode_job.h"
#include "worker/group_decode.h"

namespace vaedecode::testing {

absl::StatusOr<std::unique_ptr<parallel::Communicator>> JoinTestGroup(int rank, int world, int port,
                                                                      const std::string& group);

// A fixture's decoder, in families::DecodeDtype(info, dtype).
absl::StatusOr<std::unique_ptr<families::Decoder>> LoadFixtureDecoder(const std::string& fixture,
                                                                      at::ScalarType dtype = at::kFloat);

// The file's latent on the leader; an undefined tensor on peers (they receive it).
absl::StatusOr<at::Tensor> LeaderLatent(const std::string& file, int rank);
// The same in the rank `decoder` takes (fixture_tensors.h: InFamilyRank).
absl::StatusOr<at::Tensor> LeaderLatent(const std::string& file, int rank, const families::Decoder& decoder);

// The service's path: the leader plans `leader_job` for the group
// (worker::PlanDecode: exact when the latent shards, else dense), broadcasts
// the plan on `broadcast_on`, and every rank executes it on `execute_on`.
// Peers pass any job (theirs is ignored).
absl::StatusOr<worker::GroupDecodeResult> PlanAndExecute(families::Decoder& decoder,
                                                         parallel::Communicator& broadcast_on,
                                                         parallel::Communicator& execute_on,
                                                         const worker::DecodeJob& leader_job);

struct GroupCheckOptions {
  families::LatentSpace space = families::LatentSpace::kVae;
  std::string want_mode;      // "" = "exact" at world size > 1, else "dense"
  std::string expected_file;  // diffusers' output to compare with; "" to skip
  std::string what;           // names the case in errors
  double exact_vs_dense = 1e-5;
  double vs_diffusers = 1e-4;
};

struct GroupDecodeCheck {
  parallel::CommStats stats;  // the decode's own collectives (not the job broadcast)
  std::string mode;
  at::Tensor sample;  // the leader's whole output; undefined on peers
};

// Every rank calls it; `latent` matters on the leader only.
absl::StatusOr<GroupDecodeCheck> DecodeWithGroupAndCheck(families::Decoder& decoder, parallel::Communicator& comm,
                                                         const at::Tensor& latent, const GroupCheckOptions& options);

// One rank's part of a fixture case on a Gloo group of `world` ranks named
// `group`: decode its VAE-space latent and, when it has one, its pipeline
// latent as raw, each checked on the leader against the dense decode and
// diffusers' output. `options` gives the tolerances and the mode wanted
// (its space, expected_file and what are set here).
absl::Status CheckFixtureCase(const FixtureCase& c, int rank, int world, int port, const std::string& group,
                              GroupCheckOptions options);

// The mode the planner picks for a fixture case's latent at `world` ranks
// when every layer's latent-resolution halo is one row: "" (exact at world
// size > 1) when every band gets a row, "dense" when some would be empty.
std::string WantModeForRows(const FixtureCase& c, int world);

// The collectives one exact decode makes, by kind (the row gather to the
// leader is counted apart: always 1).
struct ExpectedCollectives {
  int64_t halo = 0;
  int64_t group_norm = 0;
  int64_t attention_kv = 0;
  int64_t total() const { return halo + group_norm + attention_kv + 1; }
};

// OK when `stats` are `want`'s at world size > 1 and empty at 1; the
// mismatch otherwise, named by `what`.
absl::Status CheckCollectives(const parallel::CommStats& stats, const ExpectedCollectives& want, int world,
                              const std::string& what);

// A seeded random latent of `shape` and the collectives its exact decode makes.
struct SyntheticDecode {
  std::vector<int64_t> shape;
  ExpectedCollectives collectives;
};

// One rank's part of decoding each of `decodes` with a Gloo group of the
// fixture's decoder, one after another in one group: each checked against
// the dense decode on the leader, and its collectives (CheckCollectives).
absl::Status CheckSyntheticDecodes(const std::string& fixture, const std::vector<SyntheticDecode>& decodes, int rank,
                                   int world, int port, const std::string& group, GroupCheckOptions options);
// The same with one count for every shape.
absl::Status CheckSyntheticDecodes(const std::string& fixture, const std::vector<std::vector<int64_t>>& shapes,
                                   const ExpectedCollectives& per_decode, int rank, int world, int port,
                                   const std::string& group, GroupCheckOptions options);

// One rank's part of a group decode of a seeded `shape` latent whose
// leader's cancel flag is up before it starts: every rank must come out
// CANCELLED; returns the collectives the stopped decode made. The same
// group then decodes the latent again, checked against dense, so a group
// left out of step fails.
absl::StatusOr<parallel::CommStats> DecodeCancelledFromTheStart(const std::string& fixture,
                                                                const std::vector<int64_t>& shape, int rank, int world,
                                                                int port, const std::string& group,
                                                                GroupCheckOptions options);

// "<fixture>_<case>_ws<world>": names of tests parameterised by case and world size.
std::string FixtureCaseName(const FixtureCase& c, int world);

// The parameter of a family's fixture-case test: one case at one world size.
//   class XExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};
//   TEST_P(XExactDecode, EqualsDenseAndDiffusers) {
//     EXPECT_TRUE(testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options).ok());
//   }
//   INSTANTIATE_TEST_SUITE_P(Fixtures, XExactDecode,
//                            ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
//                            testing::FixtureCaseAtWorldName);
using FixtureCaseAtWorld = std::tuple<FixtureCase, int>;

// Every case of the fixtures of `classes` at world sizes 1-4.
std::vector<FixtureCaseAtWorld> FixtureCasesAtWorldSizes(const std::vector<std::string>& classes);

// FixtureCaseName of the parameter.
std::string FixtureCaseAtWorldName(const ::testing::TestParamInfo<FixtureCaseAtWorld>& info);

// CheckFixtureCase on every rank of a group of that many real processes.
absl::Status RunFixtureCaseOnGroup(const FixtureCaseAtWorld& param, const std::string& group,
                                   const GroupCheckOptions& options, absl::Duration timeout = absl::Seconds(120));

}  // namespace vaedecode::testing
