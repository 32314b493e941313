// Tiled decode spread over a group (real processes, real Gloo): every rank
// decodes whole tiles, the leader blends them; the result is the single-rank
// tiled decode bit for bit, and an out-of-memory on one rank moves every
// rank down the ladder together.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "device/counting_cpu_allocator.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "tiling/tiled_decode.h"
#include "worker/decode_plan.h"
#include "worker/tiled_group_decode.h"

namespace vaedecode {
namespace {

std::unique_ptr<families::Decoder> SmallDecoder() { return families::autoencoder_kl::MakeSmallSeededAutoencoderKL(); }

at::Tensor Latent() {
  at::manual_seed(7);
  return at::randn({2, 4, 72, 56});
}

absl::Status RunTiled(int rank, int world, int port, int64_t tile, int oom_rank, int want_retries) {
  device::CountingCpuAllocator& allocator = device::CountingCpuAllocator::Install();
  auto decoder = SmallDecoder();
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                   testing::JoinTestGroup(rank, world, port, "tiled-group-test"));
  const at::Tensor z = Latent();
  const tiling::TilePlan plan = worker::PlanFromHeader(*decoder, 72, 56, {tile, tile, false});
  if (rank == oom_rank) {
    // Room for a floor tile's decode but not for this plan's tiles.
    families::DenseOps ops;
    allocator.ResetPeak();
    const int64_t base = allocator.current_bytes();
    decoder->Decode(tiling::TileLatent(z, worker::PlanFromHeader(*decoder, 72, 56, {32, 32, false}), 0, 0), ops);
    allocator.set_limit_bytes(base + (allocator.peak_bytes() - base) * 5 / 4);
  }
  absl::StatusOr<worker::TiledGroupResult> result = worker::DecodeTiledWithGroup(*decoder, *comm, z, {}, plan);
  allocator.set_limit_bytes(0);
  if (!result.ok()) return result.status();
  if (result->retries != want_retries) {
    return absl::InternalError(absl::StrCat("rank ", rank, " took ", result->retries, " retries, want ", want_retries));
  }
  if (rank != 0) return result->sample.defined() ? absl::InternalError("a peer kept the output") : absl::OkStatus();
  families::DenseOps ops;
  const at::Tensor single = tiling::DecodeTiles(*decoder, z, result->plan, ops);
  return parallel::testing::ExpectTensorEqual(result->sample, single, absl::StrCat("tiled over ", world, " ranks"));
}

TEST(TiledGroupDecode, SpreadTilesEqualTheSingleRankTiledDecode) {
  for (int world : {1, 2, 3}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          return RunTiled(rank, w, port, /*tile=*/40, /*oom_rank=*/-1, /*want_retries=*/0);
        },
        absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(TiledGroupDecode, OneRanksOutOfMemoryMovesEveryRankToTheFloorTile) {
  absl::Status s = parallel::testing::RunRanks(
      2,
      [](int rank, int w, int port) {
        return RunTiled(rank, w, port, /*tile=*/56, /*oom_rank=*/1, /*want_retries=*/1);
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace vaedecode
