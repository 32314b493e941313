#include "server/mode_selection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

// A model as the worker describes it: DENSE and TILED, EXACT when it shards.
v1::ModelInfo Model(bool exact) {
  v1::ModelInfo m;
  m.set_name("m");
  m.set_family("autoencoder_kl");
  m.add_supported_modes(v1::MODE_DENSE);
  m.add_supported_modes(v1::MODE_TILED);
  if (exact) m.add_supported_modes(v1::MODE_EXACT);
  return m;
}

v1::DecodeRequest Request(v1::Mode mode) {
  v1::DecodeRequest r;
  r.set_mode(mode);
  return r;
}

GroupResources Group(int degree) {
  GroupResources g;
  g.degree = degree;
  return g;
}

TEST(ModeSelectionTest, AutoIsExactOnlyWithRanksAndSupport) {
  EXPECT_EQ(SelectMode(Request(v1::MODE_AUTO), Model(true), Group(2))->mode, v1::MODE_EXACT);
  EXPECT_EQ(SelectMode(Request(v1::MODE_AUTO), Model(true), Group(1))->mode, v1::MODE_DENSE);
  absl::StatusOr<ModeChoice> no_support = SelectMode(Request(v1::MODE_AUTO), Model(false), Group(4));
  EXPECT_EQ(no_support->mode, v1::MODE_DENSE);
  EXPECT_THAT(no_support->reason, HasSubstr("autoencoder_kl"));
}

TEST(ModeSelectionTest, ForcedModesAreHonouredOrRefused) {
  EXPECT_EQ(SelectMode(Request(v1::MODE_DENSE), Model(true), Group(4))->mode, v1::MODE_DENSE);
  EXPECT_EQ(SelectMode(Request(v1::MODE_EXACT), Model(true), Group(2))->mode, v1::MODE_EXACT);
  EXPECT_EQ(SelectMode(Request(v1::MODE_EXACT), Model(true), Group(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = SelectMode(Request(v1::MODE_EXACT), Model(false), Group(2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("supports DENSE"));
  EXPECT_EQ(SelectMode(Request(v1::MODE_TILED), Model(true), Group(2))->mode, v1::MODE_TILED);
  EXPECT_EQ(SelectMode(Request(static_cast<v1::Mode>(17)), Model(true), Group(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModeSelectionTest, TiledIsRefusedForAModelThatIsNeverTiled) {
  v1::ModelInfo vit;  // MiniMax-H3: dense and exact only
  vit.set_name("minimax");
  vit.set_family("minimax_h3");
  vit.add_supported_modes(v1::MODE_DENSE);
  vit.add_supported_modes(v1::MODE_EXACT);
  const absl::Status s = SelectMode(Request(v1::MODE_TILED), vit, Group(2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"minimax\" (minimax_h3) cannot be decoded in TILED mode"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("supports DENSE, EXACT"));
  EXPECT_EQ(SelectMode(Request(v1::MODE_AUTO), vit, Group(2))->mode, v1::MODE_EXACT);
}

// A 1x4x64x64 latent on a model measured at 1 MiB fixed + 10 KiB per latent:
// dense ≈ 1.25 × (1 + 40) MiB = 51 MiB; one floor tile ≈ 1.25 × 11 MiB.
v1::ModelInfo Measured(bool exact) {
  v1::ModelInfo m = Model(exact);
  m.set_fixed_peak_bytes(1 << 20);
  m.set_peak_bytes_per_latent(10 << 10);
  m.set_spatial_factor(8);
  m.set_out_channels(3);
  return m;
}

v1::DecodeRequest Sized(v1::Mode mode) {
  v1::DecodeRequest r = Request(mode);
  for (int64_t d : {1, 4, 64, 64}) r.mutable_latent()->add_shape(d);
  return r;
}

GroupResources WithFree(int degree, int64_t mib_each) {
  GroupResources g = Group(degree);
  g.free_bytes_per_rank.assign(degree, mib_each << 20);
  return g;
}

TEST(ModeSelectionTest, AutoChoosesExactTiledOrWaitAroundTheThresholds) {
  const v1::ModelInfo m = Measured(true);
  const PeakEstimates need = EstimatePeaks(Sized(v1::MODE_AUTO), m, 2);
  ASSERT_GT(need.exact_rank, need.floor_tile);
  auto choose = [&](int64_t free_bytes) {
    GroupResources g = Group(2);
    g.free_bytes_per_rank = {free_bytes, free_bytes};
    return SelectMode(Sized(v1::MODE_AUTO), m, g);
  };
  EXPECT_EQ(choose(need.exact_rank)->mode, v1::MODE_EXACT);
  EXPECT_EQ(choose(need.exact_rank - 1)->mode, v1::MODE_TILED);
  EXPECT_EQ(choose(need.floor_tile)->mode, v1::MODE_TILED);
  absl::StatusOr<ModeChoice> wait = choose(need.floor_tile - 1);
  EXPECT_TRUE(wait->wait_for_memory);
  EXPECT_THAT(wait->reason, HasSubstr("waiting for memory"));
  // One tight rank is enough to rule exact out.
  GroupResources uneven = Group(2);
  uneven.free_bytes_per_rank = {need.exact_rank, need.exact_rank - 1};
  EXPECT_EQ(SelectMode(Sized(v1::MODE_AUTO), m, uneven)->mode, v1::MODE_TILED);
  // Every rank decodes tiles: a roomy leader does not make up for a peer
  // without room for one floor tile.
  uneven.free_bytes_per_rank = {need.exact_rank, need.floor_tile - 1};
  EXPECT_TRUE(SelectMode(Sized(v1::MODE_AUTO), m, uneven)->wait_for_memory);
}

TEST(ModeSelectionTest, AutoRefusesAtOnceWhatNoAmountOfWaitingCanFit) {
  const v1::ModelInfo m = Measured(true);
  const PeakEstimates need = EstimatePeaks(Sized(v1::MODE_AUTO), m, 2);
  GroupResources g = Group(2);
  g.free_bytes_per_rank = {need.floor_tile - 1, need.floor_tile - 1};
  // Memory is held elsewhere now, but the ranks could give enough: wait.
  g.capacity_bytes_per_rank = {need.floor_tile, need.floor_tile};
  EXPECT_TRUE(SelectMode(Sized(v1::MODE_AUTO), m, g)->wait_for_memory);
  // Unbounded capacity (a CPU rank without a budget): wait.
  g.capacity_bytes_per_rank = {-1, need.floor_tile - 1};
  EXPECT_TRUE(SelectMode(Sized(v1::MODE_AUTO), m, g)->wait_for_memory);
  // The tightest rank can never give a floor tile: refused, with the numbers.
  g.capacity_bytes_per_rank = {need.exact_rank, need.floor_tile - 1};
  const absl::Status never = SelectMode(Sized(v1::MODE_AUTO), m, g).status();
  EXPECT_EQ(never.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(never.message()), HasSubstr("can never be decoded on this server"));
  EXPECT_THAT(std::string(never.message()), HasSubstr(absl::StrCat((need.floor_tile - 1) >> 20, " MiB")));
}

TEST(ModeSelectionTest, AModelNeverTiledWaitsForOrIsRefusedOnItsExactBands) {
  // MiniMax-H3: without tiles the smallest plan is exact bands.
  v1::ModelInfo m = Measured(true);
  m.clear_supported_modes();
  m.add_supported_modes(v1::MODE_DENSE);
  m.add_supported_modes(v1::MODE_EXACT);
  const PeakEstimates need = EstimatePeaks(Sized(v1::MODE_AUTO), m, 2);
  ASSERT_LT(need.floor_tile, need.exact_rank);
  GroupResources g = Group(2);
  g.free_bytes_per_rank = {need.exact_rank - 1, need.exact_rank - 1};  // room for floor tiles, not for bands
  absl::StatusOr<ModeChoice> wait = SelectMode(Sized(v1::MODE_AUTO), m, g);
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_TRUE(wait->wait_for_memory);
  EXPECT_THAT(wait->reason, HasSubstr("exact bands over 2 ranks"));
  g.capacity_bytes_per_rank = {need.exact_rank - 1, need.exact_rank - 1};  // and never will be
  const absl::Status never = SelectMode(Sized(v1::MODE_AUTO), m, g).status();
  EXPECT_EQ(never.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(never.message()), HasSubstr("smallest plan (exact bands over 2 ranks"));
}

TEST(ModeSelectionTest, PackedRawLatentsAreEstimatedUnpacked) {
  // FLUX.2's raw latents pack 2x2 patches: a 32x32 raw latent decodes as 64x64.
  v1::ModelInfo m = Measured(true);
  m.set_raw_patch(2);
  v1::DecodeRequest raw = Request(v1::MODE_AUTO);
  for (int64_t d : {1, 16, 32, 32}) raw.mutable_latent()->add_shape(d);
  raw.set_latent_space(v1::LATENT_SPACE_RAW);
  const PeakEstimates packed = EstimatePeaks(raw, m, 2);
  const PeakEstimates unpacked = EstimatePeaks(Sized(v1::MODE_AUTO), m, 2);
  EXPECT_EQ(packed.dense, unpacked.dense);
  EXPECT_EQ(packed.exact_rank, unpacked.exact_rank);
}

TEST(ModeSelectionTest, AutoOnOneRankIsDenseWhenItFitsElseTiled) {
  const v1::ModelInfo m = Measured(false);
  const PeakEstimates need = EstimatePeaks(Sized(v1::MODE_AUTO), m, 1);
  GroupResources g = Group(1);
  g.free_bytes_per_rank = {need.dense};
  EXPECT_EQ(SelectMode(Sized(v1::MODE_AUTO), m, g)->mode, v1::MODE_DENSE);
  g.free_bytes_per_rank = {need.dense - 1};
  EXPECT_EQ(SelectMode(Sized(v1::MODE_AUTO), m, g)->mode, v1::MODE_TILED);
}

TEST(ModeSelectionTest, ForcedModesThatCannotFitAreFailedPreconditionWithTheNumbers) {
  const v1::ModelInfo m = Measured(true);
  absl::StatusOr<ModeChoice> exact = SelectMode(Sized(v1::MODE_EXACT), m, WithFree(2, 1));
  EXPECT_EQ(exact.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(exact.status().message()), HasSubstr("MiB free"));
  absl::StatusOr<ModeChoice> dense = SelectMode(Sized(v1::MODE_DENSE), m, WithFree(2, 1));
  EXPECT_EQ(dense.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SelectMode(Sized(v1::MODE_DENSE), m, WithFree(2, 1 << 12))->mode, v1::MODE_DENSE);
  // Unmeasured ranks (-1) do not constrain.
  GroupResources unknown = Group(2);
  unknown.free_bytes_per_rank = {-1, -1};
  EXPECT_EQ(SelectMode(Sized(v1::MODE_EXACT), m, unknown)->mode, v1::MODE_EXACT);
}

}  // namespace
}  // namespace vaedecode::server
