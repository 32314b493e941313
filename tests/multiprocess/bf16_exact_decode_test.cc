// Exact decoding in bfloat16 (weights and activations), with real worker
// processes over real Gloo: the main case of every family's fixture on 2
// ranks (3 where the latent has the rows) stays within the fixtures README's
// bf16 gate of diffusers' float32 output (max abs <= 1, RMSE <= 0.05), as the
// dense bf16 decode does (tests/golden), and close to that dense bf16 decode.

#include <iostream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/builtin_families.h"
#include "formats/tensor_file.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "tests/fixtures/sharded_fixture_cases.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

constexpr char kGroup[] = "bf16-exact-decode-test";
// The README's bf16 gate against diffusers' float32 decode.
constexpr double kMaxAbsVsDiffusers = 1.0;
constexpr double kRmseVsDiffusers = 0.05;
// Exact vs dense in bf16: the same ops on different extents round apart by
// bf16's 2^-8 relative step, compounding over the decoder's layers; a wrong
// halo row or attention key shows as O(0.1) RMSE.
constexpr double kRmseVsDense = 0.02;

double Rmse(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).pow(2).mean().sqrt().item<double>();
}

// Every sharded fixture's main case.
std::vector<testing::FixtureCase> MainCases() {
  std::vector<testing::FixtureCase> out;
  for (const testing::FixtureCase& c : testing::ShardedFixtureCases()) {
    if (c.name == "main") out.push_back(c);
  }
  return out;
}

class Bf16ExactDecode : public ::testing::TestWithParam<testing::FixtureCase> {};

TEST_P(Bf16ExactDecode, StaysWithinTheBf16GateAndNearDense) {
  const testing::FixtureCase c = GetParam();
  absl::StatusOr<at::Tensor> probe = formats::ReadTensorFile(c.latent_file, "latent");
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int world = probe->size(-2) >= 3 ? 3 : 2;
  absl::Status s = parallel::testing::RunRanks(
      world,
      [&c](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder,
                         testing::LoadFixtureDecoder(c.fixture, at::kBFloat16));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, testing::JoinTestGroup(rank, w, port, kGroup));
        ASSIGN_OR_RETURN(at::Tensor latent, testing::LeaderLatent(c.latent_file, rank, *decoder));
        testing::GroupCheckOptions o;
        o.what = absl::StrCat(c.fixture, "/", c.name, " in bf16");
        o.exact_vs_dense = kMaxAbsVsDiffusers;  // the RMSE checks below are the real bounds
        o.vs_diffusers = kMaxAbsVsDiffusers;
        o.expected_file = c.expected_file;
        ASSIGN_OR_RETURN(testing::GroupDecodeCheck checked,
                         testing::DecodeWithGroupAndCheck(*decoder, *comm, latent, o));
        if (rank != worker::kLeader) return absl::OkStatus();
        ASSIGN_OR_RETURN(at::Tensor expected_file, formats::ReadTensorFile(c.expected_file, "sample"));
        const at::Tensor expected = testing::InFamilyRank(expected_file, decoder->info().is_video);
        families::DenseOps dense;
        ASSIGN_OR_RETURN(at::Tensor dense_bf16, worker::RunDecode(*decoder, worker::DecodeJob{latent}, dense));
        const double vs_diffusers = Rmse(checked.sample, expected), vs_dense = Rmse(checked.sample, dense_bf16);
        std::cout << o.what << " exact on " << w << " ranks: RMSE vs diffusers " << vs_diffusers << ", vs dense bf16 "
                  << vs_dense << "\n";
        if (vs_diffusers > kRmseVsDiffusers || vs_dense > kRmseVsDense) {
          return absl::InternalError(absl::StrCat(o.what, ": RMSE vs diffusers ", vs_diffusers, " (gate ",
                                                  kRmseVsDiffusers, "), vs dense bf16 ", vs_dense, " (bound ",
                                                  kRmseVsDense, ")"));
        }
        return absl::OkStatus();
      },
      absl::Seconds(240));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16ExactDecode, ::testing::ValuesIn(MainCases()),
                         [](const auto& info) { return info.param.fixture; });

TEST(Bf16ExactDecodeCoverage, EveryFamilysFixtureIsTested) { EXPECT_GE(MainCases().size(), 11u); }

}  // namespace
}  // namespace vaedecode
