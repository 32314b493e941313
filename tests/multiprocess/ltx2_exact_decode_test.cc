// Exact (layer-wise sharded) LTX-2 decode equals the dense decode and
// diffusers, with real worker processes over real Gloo: the ltx2 fixture
// (2 latent rows: exact at world size 2 with 1-row bands, whose reflect
// padding at the global edges reads the neighbour's halo row; dense fallback
// at 3 and 4), from the decoder input and the pipeline latent; synthetic
// batch-2, several-frame latents with uneven bands at world sizes 2-4; and
// collective counts derived from the layer structure.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "parallel/counting_communicator.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"

namespace vaedecode {
namespace {

// Exact vs dense differ only in floating-point rounding, but LibTorch's CPU
// conv3d rounds a pixel differently depending on the input's extent (a
// band's conv3d differs from the whole image's by ~3e-6 on O(1) values), and
// random-weight decoders amplify rounding (diffusers' own fp32 decode is
// 9e-6 from fp64 here). A wrong halo row or reflected row is off by O(0.1).
constexpr double kExactVsDense = 5e-5;
constexpr double kVsDiffusers = 1e-4;
const std::vector<std::string> kClasses = {"AutoencoderKLLTX2Video"};

constexpr char kGroup[] = "ltx2-exact-decode-test";

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return o;
}

class LTX2ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(LTX2ExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options = Tolerances();
  // Few latent rows (ltx2: 2, ltx2_full: 3 and 2): a group with more ranks
  // than rows would leave a band empty, so the leader decodes densely.
  options.want_mode = testing::WantModeForRows(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LTX2ExactDecode, ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(LTX2ExactDecodeCoverage, EveryLTX2FixtureIsTested) { EXPECT_GE(testing::FixtureCases(kClasses).size(), 1u); }

// Collectives of one exact decode at world size > 1, from the layer
// structure of the ltx2 fixture (mid block: 1 resnet; 3 up blocks, each an
// upsampler and 2 resnets):
//   halo exchanges (3x3x3 convs) = 1 (conv_in) + 1 x 2 (mid resnet)
//       + 3 x (1 upsampler + 2 resnets x 2) + 1 (conv_out) = 19
//   row gather to the leader    = 1
// = 20, at any number of frames (time is never sharded: every conv sees the
// whole sequence once). No GroupNorm and no attention in LTX-2; the
// per-channel RMS norms, the depth-to-space and the unpatchify are local.
// None at world size 1. The job broadcast before the decode is counted apart.
constexpr testing::ExpectedCollectives kPerDecode{/*halo=*/19, /*group_norm=*/0, /*attention_kv=*/0};

// Batch 2, several frames, uneven bands (no such fixture): exact vs dense,
// and the count.
struct SyntheticCase {
  std::string name;
  std::vector<int64_t> latent_shape;
  int world_size;
};

class LTX2ExactDecodeSynthetic : public ::testing::TestWithParam<SyntheticCase> {};

TEST_P(LTX2ExactDecodeSynthetic, EqualsDense) {
  const SyntheticCase sc = GetParam();
  absl::Status s = parallel::testing::RunRanks(
      sc.world_size,
      [&sc](int rank, int w, int port) {
        return testing::CheckSyntheticDecodes("ltx2", {sc.latent_shape}, kPerDecode, rank, w, port, kGroup,
                                              Tolerances());
      },
      absl::Seconds(240));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(BatchTwoSeveralFrames, LTX2ExactDecodeSynthetic,
                         ::testing::Values(
                             // Bands 2,1,1,1: 1-row bands at both global edges and inside.
                             SyntheticCase{"h5_ws4", {2, 128, 2, 5, 3}, 4},
                             // Bands 3,2,2; 4 frames -> 25.
                             SyntheticCase{"h7_ws3", {1, 128, 4, 7, 2}, 3},
                             // Bands 2,1 and a single frame (every upsampler drops to 1 frame).
                             SyntheticCase{"h3_ws2_t1", {2, 128, 1, 3, 4}, 2}),
                         [](const ::testing::TestParamInfo<SyntheticCase>& info) { return info.param.name; });

TEST(LTX2ExactDecodeGroup, RepeatDecodesInOneGroupAndCountCollectives) {
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          // 2 then 3 frames: the same count at any number of frames.
          return testing::CheckSyntheticDecodes("ltx2", {{1, 128, 2, 5, 3}, {1, 128, 3, 5, 3}}, kPerDecode, rank, w,
                                                port, kGroup, Tolerances());
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

// No GroupNorm and no attention carry the leader's cancel flag here: it
// rides the halo exchanges. Up before the decode starts, every rank stops
// after the first W - 1 exchanges of 19 (the stop word takes W - 2 more to
// reach the last rank), and no row is gathered; before, the whole decode
// ran. The group stays in step: the next decode is right.
TEST(LTX2ExactDecodeGroup, ACancelStopsEveryRankWithinWMinusOneConvolutions) {
  for (int world : {2, 3, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(
              parallel::CommStats stopped,
              testing::DecodeCancelledFromTheStart("ltx2", {1, 128, 2, 5, 3}, rank, w, port, kGroup, Tolerances()));
          if (stopped.ForKind(parallel::CallKind::kHalo).calls != w - 1 ||
              stopped.ForKind(parallel::CallKind::kGatherOutput).calls != 0) {
            return absl::InternalError(absl::StrCat("rank ", rank, ": the cancelled decode made ", stopped.ToString()));
          }
          return absl::OkStatus();
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
