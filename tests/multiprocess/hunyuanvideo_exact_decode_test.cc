// Exact (layer-wise sharded) HunyuanVideo decode equals the dense decode and
// diffusers, with real worker processes over real Gloo: the hunyuanvideo
// fixture (5 latent rows, 4 frames: bands 3,2 / 2,2,1 / 2,1,1,1) at world
// sizes 1-4, from the decoder input and the pipeline latent; synthetic
// batch-2 latents with uneven bands, one frame, and more frames than diffusers
// decodes in one piece (temporal tiles, decoded by every rank alike); and
// collective counts derived from the layer structure.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "parallel/testing/multi_process.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"

namespace vaedecode {
namespace {

// Exact vs dense differ only in floating-point rounding, but LibTorch's CPU
// conv3d rounds a pixel differently depending on the input's extent (a
// band's conv3d differs from the whole image's by ~3e-6 on O(1) values),
// GroupNorm statistics are merged, and random-weight decoders amplify
// rounding (diffusers' own fp32 decode is 1.2e-5 from fp64 here). A wrong
// halo row, replicated row or attention frame is off by O(0.1).
constexpr double kExactVsDense = 5e-5;
constexpr double kVsDiffusers = 1e-4;
const std::vector<std::string> kClasses = {"AutoencoderKLHunyuanVideo"};

constexpr char kGroup[] = "hunyuanvideo-exact-decode-test";

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return o;
}

class HunyuanVideoExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(HunyuanVideoExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options = Tolerances();
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HunyuanVideoExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(HunyuanVideoExactDecodeCoverage, EveryHunyuanVideoFixtureIsTested) {
  EXPECT_GE(testing::FixtureCases(kClasses).size(), 1u);
}

// Collectives of one exact decode at world size > 1, from the layer
// structure of the hunyuanvideo fixture (4 levels, layers_per_block 2, so 3
// resnets per up block; mid block resnet-attention-resnet), per temporal
// tile (one tile up to 4 latent frames; windows every 3 frames beyond):
//   halo exchanges (3x3x3 convs) = 1 (conv_in) + 4 (mid resnets)
//       + 4 x 3 x 2 (up-block resnets) + 3 (upsamplers) + 1 (conv_out) = 33
//   GroupNorm statistics         = 4 (mid resnets) + 1 (attention)
//       + 4 x 3 x 2 (up-block resnets) + 1 (conv_norm_out) = 30
//   K/V all-gathers              = 1 (the frame-causal mid-block attention:
//       every frame's band in one gather)
// then 1 row gather to the leader: 65 for up to 4 latent frames, 129 for 6
// (2 tiles). post_quant_conv and the conv_shortcuts are 1x1x1 (no halo); the
// temporal padding, upsampling and tile blending are local. None at world
// size 1. The job broadcast before the decode is counted apart.
testing::ExpectedCollectives PerDecode(int64_t tiles) { return {33 * tiles, 30 * tiles, tiles}; }

// Batch 2, several frames, uneven bands (no such fixture): exact vs dense,
// and the count.
struct SyntheticCase {
  std::string name;
  std::vector<int64_t> latent_shape;
  int world_size;
  int64_t tiles;
};

class HunyuanVideoExactDecodeSynthetic : public ::testing::TestWithParam<SyntheticCase> {};

TEST_P(HunyuanVideoExactDecodeSynthetic, EqualsDense) {
  const SyntheticCase sc = GetParam();
  absl::Status s = parallel::testing::RunRanks(
      sc.world_size,
      [&sc](int rank, int w, int port) {
        return testing::CheckSyntheticDecodes("hunyuanvideo", {{sc.latent_shape, PerDecode(sc.tiles)}}, rank, w, port,
                                              kGroup, Tolerances());
      },
      absl::Seconds(240));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(BatchTwoSeveralFrames, HunyuanVideoExactDecodeSynthetic,
                         ::testing::Values(
                             // Bands 2,1,1,1: 1-row bands at both global edges and inside; batch 2.
                             SyntheticCase{"h5_ws4_b2", {2, 16, 2, 5, 3}, 4, 1},
                             // Bands 3,2,2; 6 latent frames: two temporal tiles ([0, 5) and [3, 6)), blended.
                             SyntheticCase{"h7_ws3_t6", {1, 16, 6, 7, 2}, 3, 2},
                             // Bands 2,1; a single frame (every upsampler keeps 1 frame).
                             SyntheticCase{"h3_ws2_t1", {2, 16, 1, 3, 4}, 2, 1}),
                         [](const ::testing::TestParamInfo<SyntheticCase>& info) { return info.param.name; });

TEST(HunyuanVideoExactDecodeGroup, RepeatDecodesInOneGroupAndCountCollectives) {
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          // 4 frames (1 tile), 6 (2 tiles), 4 again, one after another in one group.
          return testing::CheckSyntheticDecodes(
              "hunyuanvideo",
              {{{1, 16, 4, 5, 3}, PerDecode(1)}, {{1, 16, 6, 5, 3}, PerDecode(2)}, {{1, 16, 4, 5, 3}, PerDecode(1)}},
              rank, w, port, kGroup, Tolerances());
        },
        absl::Seconds(240));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
