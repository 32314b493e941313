// PlanDecode: the latent prepared once (validated, noised, de-normalised,
// in the decoder's dtype), and the mode and tiles chosen for the group.

#include "worker/decode_plan.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "tiling/memory_model.h"

namespace vaedecode::worker {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<families::Decoder> SmallDecoder() {
  return families::autoencoder_kl::MakeSmallSeededAutoencoderKL(0.5);
}

DecodeJob Job(int64_t rows, int64_t cols) {
  at::manual_seed(3);
  DecodeJob job;
  job.latent = at::randn({1, 4, rows, cols});
  return job;
}

PlanningContext Group(DecodeMode requested, int world) {
  PlanningContext context;
  context.requested = requested;
  context.world_size = world;
  return context;
}

TEST(PlanDecode, ARawLatentIsConvertedOnceToTheDecodersSpaceAndDtype) {
  auto decoder = SmallDecoder();
  DecodeJob job = Job(8, 8);
  job.latent = job.latent.to(at::kHalf);
  job.latent_space = families::LatentSpace::kRaw;
  absl::StatusOr<DecodePlan> plan = PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->latent.scalar_type(), decoder->dtype());
  EXPECT_TRUE(plan->latent.is_contiguous());
  EXPECT_TRUE(plan->latent.equal(decoder->ToVaeSpace(job.latent.to(at::kFloat))));
  EXPECT_FALSE(plan->noise_seed.has_value());
}

TEST(PlanDecode, TheRequestsOwnScalingReplacesTheFamilys) {
  auto decoder = SmallDecoder();
  DecodeJob job = Job(8, 8);
  job.latent_space = families::LatentSpace::kRaw;
  job.scaling_factor = 4.0;
  job.shift_factor = 0.25;
  absl::StatusOr<DecodePlan> plan = PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->latent.equal(job.latent / 4.0 + 0.25));
}

TEST(PlanDecode, DecodeNoiseIsSeededAndReported) {
  auto decoder = SmallDecoder();
  DecodeJob job = Job(8, 8);
  job.noise_scale = 0.25;
  job.noise_seed = 11;
  absl::StatusOr<DecodePlan> first = PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1));
  absl::StatusOr<DecodePlan> second = PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->noise_seed, std::optional<uint64_t>(11));
  EXPECT_TRUE(first->latent.equal(second->latent));
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor noise = at::randn(job.latent.sizes(), generator, at::TensorOptions().dtype(at::kFloat));
  EXPECT_TRUE(first->latent.allclose(0.75 * job.latent + 0.25 * noise));
  // Unseeded: a seed is drawn and reported, so the decode can be repeated.
  job.noise_seed.reset();
  absl::StatusOr<DecodePlan> drawn = PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1));
  ASSERT_TRUE(drawn.ok());
  ASSERT_TRUE(drawn->noise_seed.has_value());
  job.noise_seed = drawn->noise_seed;
  EXPECT_TRUE(PlanDecode(*decoder, job, Group(DecodeMode::kDense, 1))->latent.equal(drawn->latent));
}

TEST(PlanDecode, ALatentTheModelCannotTakeIsRefusedBeforeAnyWork) {
  auto decoder = SmallDecoder();
  DecodeJob job;
  job.latent = at::zeros({1, 3, 8, 8});
  absl::StatusOr<DecodePlan> plan = PlanDecode(*decoder, job, Group(DecodeMode::kExact, 2));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanDecode, ExactWhenTheLatentShardsElseDenseWithTheReason) {
  auto decoder = SmallDecoder();
  absl::StatusOr<DecodePlan> exact = PlanDecode(*decoder, Job(8, 8), Group(DecodeMode::kExact, 3));
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->mode, DecodeMode::kExact);
  EXPECT_EQ(exact->reason, "exact sharding over 3 ranks");
  absl::StatusOr<DecodePlan> thin = PlanDecode(*decoder, Job(2, 8), Group(DecodeMode::kExact, 3));
  ASSERT_TRUE(thin.ok());
  EXPECT_EQ(thin->mode, DecodeMode::kDense);
  EXPECT_THAT(thin->reason, HasSubstr("thinner than the conv halo"));
  absl::StatusOr<DecodePlan> one = PlanDecode(*decoder, Job(8, 8), Group(DecodeMode::kExact, 1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->mode, DecodeMode::kDense);
  absl::StatusOr<DecodePlan> forced = PlanDecode(*decoder, Job(8, 8), Group(DecodeMode::kDense, 3));
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->mode, DecodeMode::kDense);
  EXPECT_EQ(forced->reason, "dense decoding was requested");
}

TEST(PlanDecode, TilesFitTheTightestRankLessTheOutput) {
  auto decoder = SmallDecoder();
  tiling::PeakProfile profile;
  profile.bytes_per_latent = 1000;
  const DecodeJob job = Job(96, 80);
  const int64_t output = OutputBytes(*decoder, job.latent);
  PlanningContext context = Group(DecodeMode::kTiled, 2);
  context.profile = &profile;
  // Unbounded: one tile of the whole latent, still tiled.
  absl::StatusOr<DecodePlan> whole = PlanDecode(*decoder, job, context);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->mode, DecodeMode::kTiled);
  EXPECT_EQ(whole->tiles.calls(), 1);
  EXPECT_EQ(whole->tile_shape.rows, 96);
  EXPECT_THAT(whole->reason, HasSubstr("without a memory bound"));
  // The tighter rank bounds the tile: room for about a 40x40 tile.
  const int64_t tile_room = static_cast<int64_t>(40 * 40 * 1000 * tiling::kHeadroom);
  context.free_bytes_per_rank = {int64_t{1} << 40, output + tile_room, -1};
  absl::StatusOr<DecodePlan> tiled = PlanDecode(*decoder, job, context);
  ASSERT_TRUE(tiled.ok());
  EXPECT_GT(tiled->tiles.calls(), 1);
  EXPECT_LE(tiled->tiles.rows.tile * tiled->tiles.cols.tile, 40 * 40);
  EXPECT_LE(tiled->tiles.peak_bytes, tile_room);
  EXPECT_THAT(tiled->reason, HasSubstr(absl::StrCat("tiled to fit ", tile_room >> 20, " MiB free per rank")));
  // The header's shape rebuilds the same tiles on every rank.
  const tiling::TilePlan rebuilt = PlanFromHeader(*decoder, 96, 80, tiled->tile_shape);
  EXPECT_EQ(rebuilt.rows.starts, tiled->tiles.rows.starts);
  EXPECT_EQ(rebuilt.cols.starts, tiled->tiles.cols.starts);
}

TEST(PlanDecode, TilesPredictedNotToFitAreRefusedBeforeAnyDecode) {
  auto decoder = SmallDecoder();
  tiling::PeakProfile profile;
  profile.bytes_per_latent = 1000;
  const DecodeJob job = Job(96, 80);
  PlanningContext context = Group(DecodeMode::kTiled, 1);
  context.profile = &profile;
  // Room for less than a floor tile (32x32 latents at 1000 bytes each, with headroom).
  context.free_bytes_per_rank = {OutputBytes(*decoder, job.latent) + 30 * 30 * 1000};
  absl::StatusOr<DecodePlan> plan = PlanDecode(*decoder, job, context);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_THAT(plan.status().message(), HasSubstr("nothing was decoded"));
  EXPECT_THAT(plan.status().message(), HasSubstr("32-latent floor tile needs about 1.2 MiB"));
  // Room for the floor tile plans it.
  context.free_bytes_per_rank = {OutputBytes(*decoder, job.latent) +
                                 static_cast<int64_t>(32 * 32 * 1000 * tiling::kHeadroom) + 1};
  plan = PlanDecode(*decoder, job, context);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tiles.rows.tile, tiling::kFloorTile);
}

TEST(PlanDecode, VideoFramesScaleTheTilesPeak) {
  // The memory model sees the clip's frames (tiling/memory_model.h): a
  // decoder holding five latent frames at once needs smaller tiles.
  families::ModelInfo info;
  info.temporal_factor = 4;
  info.peak_latent_frames = 0;
  tiling::PeakProfile profile;
  profile.bytes_per_latent = 1000;
  const tiling::MemoryModel model = tiling::MemoryModelOf(info, profile);
  EXPECT_EQ(tiling::RegionPeakBytes(model, {1, 5, 32, 32}, 32, 32, 1024, 1.0),
            17 * tiling::RegionPeakBytes(model, {1, 1, 32, 32}, 32, 32, 1024, 1.0));
}

}  // namespace
}  // namespace vaedecode::worker
