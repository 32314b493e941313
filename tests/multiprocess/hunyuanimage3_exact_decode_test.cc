// Exact (layer-wise sharded) Hunyuan Image 3 decode equals the dense decode
// and the release's, with real worker processes over real Gloo: both
// AutoencoderKLConv3D fixtures at world sizes 1-4 (7 latent rows: bands
// 4,3 / 3,2,2 / 2,2,2,1; the batch-2 case's 5 rows), from the decoder input
// and the pipeline latent; synthetic batch-2 latents with 1-row bands; and
// collective counts derived from the layer structure. Every layer after the
// first temporal upsampler runs on 2 frames that see each other (3x3x3
// convs, GroupNorm over T, H and W): the exact path shards rows, not time.

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
// a conv3d's rounding depends on its input's extent); the release's fp32
// decode is 5e-7 from fp64 here. A wrong halo row or sub-pixel order is off
// by O(0.1).
constexpr double kExactVsDense = 1e-5;
constexpr double kVsRelease = 1e-4;
constexpr char kGroup[] = "hunyuanimage3-exact-decode-test";
const std::vector<std::string> kClasses = {"AutoencoderKLConv3D"};

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsRelease;
  return o;
}

class HunyuanImage3ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(HunyuanImage3ExactDecode, EqualsDenseAndTheRelease) {
  testing::GroupCheckOptions options = Tolerances();
  options.want_mode = testing::WantModeForRows(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HunyuanImage3ExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(HunyuanImage3ExactDecodeCoverage, EveryHunyuanImage3FixtureIsTested) {
  EXPECT_GE(testing::FixtureCases(kClasses).size(), 2u);
}

// Collectives of one exact decode at world size > 1, from the layer
// structure of the hunyuanimage3 fixture (3 levels of width 32,
// layers_per_block 0, so 1 resnet per level; 2 UpsampleDCAE, the first also
// doubling time; mid block resnet-attention-resnet):
//   halo exchanges (3x3x3 convs) = 1 (conv_in) + 2 x 2 (mid resnets)
//       + 3 x 2 (up resnets) + 2 (upsamplers) + 1 (conv_out) = 14
//   GroupNorm statistics         = 2 x 2 (mid resnets) + 1 (attention)
//       + 3 x 2 (up resnets) + 1 (norm_out) = 12
//   K/V all-gathers              = 1 (mid-block attention, the one latent frame)
//   row gather to the leader     = 1
// = 28. The attention's q/k/v/proj_out convs are 1x1x1 (no halo); the
// repeat shortcuts and the sub-pixel shuffles are row-local. None at world size 1.
constexpr testing::ExpectedCollectives kPerDecode{/*halo=*/14, /*group_norm=*/12, /*attention_kv=*/1};

TEST(HunyuanImage3ExactDecodeGroup, BatchTwoOneRowBandsAndCollectiveCounts) {
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          // Heights 5 (bands 2,1,1,1 at 4 ranks: 1-row bands at both global
          // edges and inside) and 6, batch 2, one after the other in one group.
          return testing::CheckSyntheticDecodes("hunyuanimage3", {{2, 16, 5, 3}, {2, 16, 6, 4}}, kPerDecode, rank, w,
                                                port, kGroup, Tolerances());
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
