// Exact (layer-wise sharded) FLUX.2 decode equals the dense decode and
// diffusers, with real worker processes over real Gloo: every
// AutoencoderKLFlux2 fixture at world sizes 1-4 (latent heights 26 and 17,
// so bands are uneven), the raw pipeline latent (13 raw rows, banded before
// the BatchNorm de-normalisation and the 2x2 unpatchify double them), and
// collective counts derived from the layer structure.

#include <iostream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/builtin_families.h"
#include "families/layer_ops.h"
#include "formats/tensor_file.h"
#include "parallel/counting_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/decode_job.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

using parallel::testing::ExpectTensorClose;

// Exact and dense differ only in floating-point rounding (FLUX.2's decoder
// is 2-D, so mostly GroupNorm's merged statistics), but this random-weight
// decoder amplifies rounding: diffusers' own fp32 decode is 1.2e-5 from its
// fp64 decode (fixtures README). Measured exact vs dense: up to 1.4e-5 on
// values up to 5. A wrong halo row or patch order is off by O(0.1).
constexpr double kExactVsDense = 5e-5;
constexpr double kVsDiffusers = 1e-4;
const std::vector<std::string> kClasses = {"AutoencoderKLFlux2"};

absl::StatusOr<std::unique_ptr<parallel::Communicator>> Join(int rank, int world, int port) {
  return testing::JoinTestGroup(rank, world, port, "flux2-exact-decode-test");
}

using Checked = testing::GroupDecodeCheck;
using testing::LeaderLatent;

absl::StatusOr<std::unique_ptr<families::Decoder>> LoadFixture(const std::string& fixture) {
  return testing::LoadFixtureDecoder(fixture);
}

// Decodes `latent` (given on the leader only) in `space` with the group; on
// the leader, checks it against the dense decode and diffusers' output.
absl::StatusOr<Checked> DecodeAndCheck(families::Decoder& decoder, parallel::Communicator& comm,
                                       const at::Tensor& latent, families::LatentSpace space,
                                       const std::string& expected_file, const std::string& what) {
  testing::GroupCheckOptions o;
  o.space = space;
  o.expected_file = expected_file;
  o.what = what;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return testing::DecodeWithGroupAndCheck(decoder, comm, latent, o);
}

class Flux2ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(Flux2ExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options;
  options.exact_vs_dense = kExactVsDense;
  options.vs_diffusers = kVsDiffusers;
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), "flux2-exact-decode-test", options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Flux2ExactDecode, ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(Flux2ExactDecodeCoverage, EveryFlux2FixtureIsTested) { EXPECT_GE(testing::FixtureCases(kClasses).size(), 2u); }

// Collectives of one exact decode at world size > 1, from the layer
// structure of the flux2_kl fixture (4 levels, layers_per_block 2, so 3
// resnets per up block; mid block resnet-attention-resnet):
//   halo exchanges (3x3 convs) = 1 (conv_in) + 4 (mid resnets) + 4 x 3 x 2
//       (up-block resnets) + 3 (upsamplers) + 1 (conv_out) = 33
//   GroupNorm statistics       = 4 (mid resnets) + 1 (attention) + 4 x 3 x 2
//       (up-block resnets) + 1 (conv_norm_out) = 30
//   K/V all-gathers            = 1 (mid-block attention)
//   row gather to the leader   = 1
// = 65. post_quant_conv and the conv_shortcuts are 1x1 (no halo); the
// BatchNorm de-normalisation and the unpatchify of a raw latent are per
// channel / per row: none, so raw and VAE-space decodes count the same. None
// at world size 1. The job broadcast before the decode is counted apart.
constexpr int64_t kHalo = 33;
constexpr int64_t kGroupNorm = 30;

TEST(Flux2ExactDecodeGroup, RepeatDecodesInOneGroupAndCountCollectives) {
  testing::FixtureCase c;
  for (const testing::FixtureCase& f : testing::FixtureCases(kClasses)) {
    if (f.name == "main") c = f;
  }
  ASSERT_FALSE(c.fixture.empty());
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [&](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
          for (int repeat = 0; repeat < 2; ++repeat) {
            const bool raw = repeat == 1;
            ASSIGN_OR_RETURN(at::Tensor latent, LeaderLatent(raw ? c.pipeline_latent_file : c.latent_file, rank));
            ASSIGN_OR_RETURN(
                Checked checked,
                DecodeAndCheck(*decoder, *comm, latent, raw ? families::LatentSpace::kRaw : families::LatentSpace::kVae,
                               c.expected_file, c.fixture));
            const parallel::CommStats& st = checked.stats;
            const bool sharded = w > 1;
            const int64_t want = sharded ? kHalo + kGroupNorm + 1 + 1 : 0;
            if (st.collectives() != want || st.ForKind(parallel::CallKind::kHalo).calls != (sharded ? kHalo : 0) ||
                st.ForKind(parallel::CallKind::kGroupNormStats).calls != (sharded ? kGroupNorm : 0) ||
                st.ForKind(parallel::CallKind::kAttentionKV).calls != (sharded ? 1 : 0)) {
              return absl::InternalError(absl::StrCat(c.fixture, raw ? " raw" : " vae", " decode made ",
                                                      st.collectives(), " collectives, want ", want, ": ",
                                                      st.ToString()));
            }
          }
          return absl::OkStatus();
        },
        absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(Flux2ExactDecodeGroup, RawBandsThinnerThanTheHaloFallBackToDense) {
  // 2 raw rows unpack to 4 VAE-space rows, which 6 ranks cannot all get a
  // band of: the VAE-space partition (the latent every rank's band is cut
  // from) is the binding one.
  testing::FixtureCase c;
  for (const testing::FixtureCase& f : testing::FixtureCases(kClasses)) {
    if (f.name == "main") c = f;
  }
  ASSERT_FALSE(c.fixture.empty());
  absl::Status s = parallel::testing::RunRanks(
      6,
      [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
        ASSIGN_OR_RETURN(at::Tensor raw, LeaderLatent(c.pipeline_latent_file, rank));
        worker::DecodeJob input;
        if (rank == worker::kLeader) input.latent = raw.narrow(2, 0, 2).contiguous();
        input.latent_space = families::LatentSpace::kRaw;
        ASSIGN_OR_RETURN(worker::GroupDecodeResult result, testing::PlanAndExecute(*decoder, *comm, *comm, input));
        // Every rank learns the mode from the job header; the leader also has the reason.
        if (result.mode != worker::DecodeMode::kDense ||
            (rank == worker::kLeader && result.reason.find("thinner than the conv halo") == std::string::npos)) {
          return absl::InternalError(absl::StrCat("mode ", worker::ModeName(result.mode), " (", result.reason, ")"));
        }
        if (rank != worker::kLeader) return absl::OkStatus();
        families::DenseOps dense;
        ASSIGN_OR_RETURN(at::Tensor want, worker::RunDecode(*decoder, input, dense));
        if (result.sample.sizes() != at::IntArrayRef({1, 3, 32, 112})) {
          return absl::InternalError(absl::StrCat("dense fallback shape ", c10::str(result.sample.sizes())));
        }
        return parallel::testing::ExpectTensorEqual(result.sample, want, "dense fallback");
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace vaedecode
