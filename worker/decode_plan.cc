#include "worker/decode_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/status_macros.h"
#include "tiling/memory_model.h"

namespace vaedecode::worker {

const char* ModeName(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kDense:
      return "dense";
    case DecodeMode::kExact:
      return "exact";
    case DecodeMode::kTiled:
      return "tiled";
  }
  return "unknown";
}

DecodeMode PlannedMode(v1::Mode mode) {
  if (mode == v1::MODE_DENSE) return DecodeMode::kDense;
  if (mode == v1::MODE_TILED) return DecodeMode::kTiled;
  return DecodeMode::kExact;
}

int64_t OutputBytes(const families::Decoder& decoder, const at::Tensor& latent) {
  int64_t bytes = 4;
  for (int64_t d : decoder.OutputShape(latent.sizes().vec())) bytes *= d;
  return bytes;
}

namespace {

// Tiles for the tightest rank: every rank decodes whole tiles while the
// leader also holds the blended float32 output. RESOURCE_EXHAUSTED, before
// anything is decoded, when even the smallest tiles are predicted not to fit.
absl::Status PlanTiles(const families::Decoder& decoder, const PlanningContext& context, DecodePlan& plan) {
  const at::Tensor& z = plan.latent;
  const tiling::LatentExtent extent{z.size(0), decoder.info().is_video ? z.size(2) : 1, z.size(-2), z.size(-1)};
  const int64_t budget = tiling::TileBudgetBytes(context.free_bytes_per_rank, OutputBytes(decoder, z));
  tiling::FamilyGeometry geometry = tiling::DecoderGeometry(decoder);
  geometry.latent = extent;
  if (context.profile != nullptr) geometry = tiling::PlanningGeometry(decoder, *context.profile, extent);
  plan.tiles = tiling::PlanTiles(z.size(-2), z.size(-1), geometry, budget);
  plan.budget_bytes = budget >= tiling::kUnboundedBudget ? -1 : budget;
  plan.floor_tile_bytes = tiling::FloorTilePeakBytes(geometry.memory, geometry.latent);
  if (!plan.tiles.fits) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tiled decode would run out of memory, so nothing was decoded: the budget is %.1f MiB per rank and a "
        "%d-latent floor tile needs about %.1f MiB (the smallest tiles, %dx%d latents, about %.1f MiB)",
        budget / 1048576.0, tiling::kFloorTile, plan.floor_tile_bytes / 1048576.0, plan.tiles.rows.tile,
        plan.tiles.cols.tile, plan.tiles.peak_bytes / 1048576.0));
  }
  // The whole latent fits: one tile (still the tiled protocol, as requested).
  if (plan.tiles.kind == tiling::PlanKind::kUntiled) plan.tiles.kind = tiling::PlanKind::kTiled;
  plan.tile_shape = {plan.tiles.rows.tile, plan.tiles.cols.tile, plan.tiles.kind == tiling::PlanKind::kStock};
  plan.reason = budget >= tiling::kUnboundedBudget
                    ? absl::StrCat("tiled without a memory bound: ", plan.tiles.reason)
                    : absl::StrCat("tiled to fit ", budget >> 20, " MiB free per rank: ", plan.tiles.reason);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodePlan> PlanDecode(const families::Decoder& decoder, const DecodeJob& job,
                                      const PlanningContext& context) {
  ASSIGN_OR_RETURN(PreparedLatent prepared, PrepareLatent(decoder, job));
  DecodePlan plan;
  plan.latent = std::move(prepared.z);
  plan.noise_seed = prepared.noise_seed;
  plan.conditioning = job.conditioning;
  plan.world_size = context.world_size;
  switch (context.requested) {
    case DecodeMode::kTiled:
      if (!decoder.info().spatial_tiling) {
        return absl::InvalidArgumentError(
            absl::StrCat(decoder.info().diffusers_class, " is not decoded in spatial tiles (use dense or exact)"));
      }
      plan.mode = DecodeMode::kTiled;
      RETURN_IF_ERROR(PlanTiles(decoder, context, plan));
      return plan;
    case DecodeMode::kDense:
      plan.mode = DecodeMode::kDense;
      plan.reason = context.world_size > 1 ? "dense decoding was requested" : "one rank";
      return plan;
    case DecodeMode::kExact:
      break;
  }
  // Sharded in VAE space: the rows every rank's band is cut from.
  const absl::Status shardable = decoder.CheckExactSharding(plan.latent.sizes().vec(), context.world_size);
  if (shardable.ok()) {
    plan.mode = DecodeMode::kExact;
    plan.reason = absl::StrCat("exact sharding over ", context.world_size, " ranks");
  } else {
    plan.mode = DecodeMode::kDense;
    plan.reason = std::string(shardable.message());
  }
  return plan;
}

tiling::TilePlan PlanFromHeader(const families::Decoder& decoder, int64_t rows, int64_t cols, const TileShape& shape) {
  tiling::TilePlan plan;
  if (shape.stock) {
    const tiling::FamilyGeometry g = tiling::DecoderGeometry(decoder);
    plan.kind = tiling::PlanKind::kStock;
    plan.rows = tiling::StockLayout(rows, g);
    plan.cols = tiling::StockLayout(cols, g);
    plan.reason = "stock tiles";
    return plan;
  }
  plan.kind = tiling::PlanKind::kTiled;
  plan.rows = tiling::SpreadTiles(rows, shape.rows);
  plan.cols = tiling::SpreadTiles(cols, shape.cols);
  plan.reason = "seam-free tiles";
  return plan;
}

std::string DescribePlan(const tiling::TilePlan& plan, int world_size) {
  return absl::StrCat(plan.rows.starts.size(), "x", plan.cols.starts.size(), " tiles of ", plan.rows.tile, "x",
                      plan.cols.tile, " latents over ", world_size, " rank(s)");
}

}  // namespace vaedecode::worker
