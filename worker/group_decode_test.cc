// The executor on a group of one (a real world-size-1 Gloo communicator,
// the CLI's group): each mode's output, the tiled out-of-memory ladder, a
// tiled cancellation, and the statistics gather.

#include "worker/group_decode.h"

#include <atomic>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "device/counting_cpu_allocator.h"
#include "device/device_memory.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "parallel/gloo_communicator.h"
#include "tiling/tiled_decode.h"
#include "worker/decode_plan.h"

namespace vaedecode::worker {
namespace {

std::unique_ptr<families::Decoder> SmallDecoder() { return families::autoencoder_kl::MakeSmallSeededAutoencoderKL(); }

at::Tensor Latent(int64_t rows, int64_t cols) {
  at::manual_seed(7);
  return at::randn({1, 4, rows, cols});
}

std::unique_ptr<parallel::Communicator> GroupOfOne() {
  parallel::GlooOptions options;
  options.world_size = 1;
  options.group_name = "group-decode-test";
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = parallel::GlooCommunicator::Create(options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

DecodePlan Plan(families::Decoder& decoder, const at::Tensor& latent, DecodeMode mode,
                std::vector<int64_t> free_bytes = {}) {
  PlanningContext context;
  context.requested = mode;
  context.free_bytes_per_rank = std::move(free_bytes);
  absl::StatusOr<DecodePlan> plan = PlanDecode(decoder, DecodeJob{latent}, context);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

TEST(ExecutePlan, DenseIsTheDecodersOwnOutput) {
  auto decoder = SmallDecoder();
  auto comm = GroupOfOne();
  const at::Tensor z = Latent(16, 16);
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(*decoder, *comm, Plan(*decoder, z, DecodeMode::kDense));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->mode, DecodeMode::kDense);
  families::DenseOps ops;
  EXPECT_TRUE(result->sample.equal(decoder->Decode(z, ops)));
  EXPECT_GT(result->decode_ms, 0);
}

TEST(ExecutePlan, TiledIsTheTilesBlended) {
  auto decoder = SmallDecoder();
  auto comm = GroupOfOne();
  const at::Tensor z = Latent(72, 56);
  DecodePlan plan = Plan(*decoder, z, DecodeMode::kTiled);
  plan.tile_shape = {40, 40, false};  // as a header would carry a budget's tiles
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(*decoder, *comm, plan);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->mode, DecodeMode::kTiled);
  EXPECT_EQ(result->tile_plan, "3x2 tiles of 40x40 latents over 1 rank(s)");
  families::DenseOps ops;
  EXPECT_TRUE(result->sample.equal(tiling::DecodeTiles(*decoder, z, result->tiles, ops)));
}

TEST(ExecutePlan, ATiledOutOfMemoryRetriesAtTheFloorTile) {
  auto decoder = SmallDecoder();
  auto comm = GroupOfOne();
  device::CountingCpuAllocator& allocator = device::CountingCpuAllocator::Install();
  const at::Tensor z = Latent(96, 80);
  DecodePlan plan = Plan(*decoder, z, DecodeMode::kTiled);
  plan.tile_shape = {96, 64, false};  // big tiles
  // Room for a floor tile's decode, not for a big tile's.
  families::DenseOps ops;
  const int64_t base = allocator.current_bytes();
  auto tile_peak = [&](int64_t rows, int64_t cols) {
    allocator.ResetPeak();
    decoder->Decode(z.narrow(2, 0, rows).narrow(3, 0, cols).contiguous(), ops);
    return allocator.peak_bytes() - base;
  };
  const int64_t floor_peak = tile_peak(tiling::kFloorTile, tiling::kFloorTile);
  const int64_t wide_peak = tile_peak(96, 64);
  const int64_t output = OutputBytes(*decoder, z);
  ASSERT_GT(wide_peak - floor_peak, 2 * 6 * output) << "the test needs tiles whose peaks differ clearly";
  allocator.set_limit_bytes(base + (floor_peak + wide_peak) / 2 + 6 * output);
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(*decoder, *comm, plan);
  allocator.set_limit_bytes(0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tile_retries, 1);
  EXPECT_EQ(result->tiles.rows.tile, tiling::kFloorTile);
  EXPECT_TRUE(result->sample.equal(tiling::DecodeTiles(*decoder, z, result->tiles, ops)));

  // Without room even for stock tiles the ladder ends, in step.
  allocator.set_limit_bytes(base + floor_peak / 4);
  absl::StatusOr<GroupDecodeResult> exhausted = ExecutePlan(*decoder, *comm, plan);
  allocator.set_limit_bytes(0);
  EXPECT_EQ(exhausted.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsInStep(exhausted.status()));
}

TEST(ExecutePlan, ACancelledTiledDecodeStopsInStep) {
  auto decoder = SmallDecoder();
  auto comm = GroupOfOne();
  DecodePlan plan = Plan(*decoder, Latent(72, 56), DecodeMode::kTiled);
  plan.tile_shape = {40, 40, false};
  std::atomic<bool> cancelled{true};
  absl::StatusOr<GroupDecodeResult> result = ExecutePlan(*decoder, *comm, plan, {&cancelled, nullptr});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(IsInStep(result.status()));
}

TEST(GatherRankStats, ReportsThisRanksFiguresAndMemory) {
  device::CountingCpuAllocator::Install();
  absl::StatusOr<device::DeviceMemory*> memory = device::InstallDeviceMemory(c10::Device(c10::kCPU));
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto comm = GroupOfOne();
  GroupDecodeResult mine;
  mine.decode_ms = 12.5;
  mine.peak_bytes = 4096;
  absl::StatusOr<std::vector<RankStats>> ranks = GatherRankStats(*comm, mine);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].decode_ms, 12.5);
  EXPECT_EQ((*ranks)[0].peak_bytes, 4096);
  EXPECT_EQ((*ranks)[0].free_bytes, (*memory)->free_bytes());
  EXPECT_EQ((*ranks)[0].capacity_bytes, (*memory)->capacity_bytes());
}

}  // namespace
}  // namespace vaedecode::worker
