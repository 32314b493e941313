// Exact (layer-wise sharded) HunyuanImage-2.1 decode equals the dense decode
// and diffusers, with real worker processes over real Gloo: both
// AutoencoderKLHunyuanImage fixtures at world sizes 1-4 (7 latent rows:
// bands 4,3 / 3,2,2 / 2,2,2,1; the batch-2 case's 3 rows shard up to 3 ranks
// and fall back to dense at 4), from the decoder input and the pipeline
// latent; synthetic batch-2 latents with 1-row bands; and collective counts
// derived from the layer structure.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "families/builtin_families.h"
#include "parallel/testing/multi_process.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

// Exact and dense differ only in rounding (GroupNorm's merged statistics;
// the decoder is 2-D); diffusers' own fp32 decode is 1.4e-6 from fp64 here.
// A wrong halo row or sub-pixel order is off by O(0.1).
constexpr double kExactVsDense = 1e-5;
constexpr double kVsDiffusers = 1e-4;
constexpr char kGroup[] = "hunyuanimage-exact-decode-test";
const std::vector<std::string> kClasses = {"AutoencoderKLHunyuanImage"};

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return o;
}

class HunyuanImageExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(HunyuanImageExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options = Tolerances();
  options.want_mode = testing::WantModeForRows(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HunyuanImageExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(HunyuanImageExactDecodeCoverage, EveryHunyuanImageFixtureIsTested) {
  EXPECT_GE(testing::FixtureCases(kClasses).size(), 2u);
}

// Collectives of one exact decode at world size > 1, from the layer
// structure of the hunyuanimage21 fixture (6 levels, layers_per_block 1, so
// 2 resnets per level; 5 upsamplers; mid block resnet-attention-resnet):
//   halo exchanges (3x3 convs) = 1 (conv_in) + 2 x 2 (mid resnets)
//       + 6 x 2 x 2 (up resnets) + 5 (upsamplers) + 1 (conv_out) = 35
//   GroupNorm statistics       = 2 x 2 (mid resnets) + 1 (attention)
//       + 6 x 2 x 2 (up resnets) + 1 (norm_out) = 30
//   K/V all-gathers            = 1 (mid-block attention)
//   row gather to the leader   = 1
// = 67. The attention's q/k/v/proj convs are 1x1 (no halo); the repeat
// shortcuts and sub-pixel shuffles are row-local. None at world size 1.
constexpr testing::ExpectedCollectives kPerDecode{/*halo=*/35, /*group_norm=*/30, /*attention_kv=*/1};

TEST(HunyuanImageExactDecodeGroup, BatchTwoOneRowBandsAndCollectiveCounts) {
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          // Heights 5 (bands 2,1,1,1 at 4 ranks: 1-row bands at both global
          // edges and inside) and 6, batch 2, one after the other in one group.
          return testing::CheckSyntheticDecodes("hunyuanimage21", {{2, 16, 5, 3}, {2, 16, 6, 4}}, kPerDecode, rank, w,
                                                port, kGroup, Tolerances());
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
