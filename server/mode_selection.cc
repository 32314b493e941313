#include "server/mode_selection.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/modes.h"
#include "server/request_validation.h"
#include "tiling/memory_model.h"

namespace vaedecode::server {
namespace {

bool Supports(const v1::ModelInfo& model, v1::Mode mode) {
  if (mode == v1::MODE_DENSE) return true;  // every decoder runs whole
  return std::any_of(model.supported_modes().begin(), model.supported_modes().end(),
                     [mode](int m) { return m == mode; });
}

std::string SupportedList(const v1::ModelInfo& model) {
  std::vector<std::string> names = {"DENSE"};
  for (int m : model.supported_modes()) {
    if (m != v1::MODE_DENSE) names.push_back(rpc::ModeLabel(static_cast<v1::Mode>(m)));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace

PeakEstimates EstimatePeaks(const v1::DecodeRequest& request, const v1::ModelInfo& model, int degree) {
  const auto& shape = request.latent().shape();
  PeakEstimates e;
  const tiling::PeakCosts costs{model.fixed_peak_bytes(), model.peak_bytes_per_latent(), model.attention_fixed_bytes(),
                                model.attention_bytes_per_latent(), model.attention_bytes_per_latent_pair()};
  if (model.is_audio()) {
    // Calibrated on [1, C, L, (latent_bins)] latents as L rows of one column
    // (tiling/calibration.h); other bins scale the rows. Decoded dense.
    const tiling::MemoryModel memory{costs, 1, 1};
    int64_t rows = AudioLatentFrames(request, model);
    if (const int64_t bins = AudioLatentBins(request, model); bins > 0 && model.latent_bins() > 0) {
      rows = (rows * bins + model.latent_bins() - 1) / model.latent_bins();
    }
    e.dense = tiling::DensePeakBytes(memory, {shape.empty() ? 1 : shape[0], 1, rows, 1});
    e.exact_rank = e.floor_tile = e.dense;
    return e;
  }
  if (shape.size() < 4) return e;
  // The decoder sees VAE-space latents: a packed raw latent unpacks first.
  const int64_t patch = request.latent_space() == v1::LATENT_SPACE_RAW && model.raw_patch() > 1 ? model.raw_patch() : 1;
  const tiling::LatentExtent latent{shape[0], shape.size() == 5 ? shape[2] : 1, patch * shape[shape.size() - 2],
                                    patch * shape[shape.size() - 1]};
  const tiling::MemoryModel memory{costs, model.temporal_factor(), model.peak_latent_frames()};
  // The leader also holds the gathered (or blended) float32 output.
  const int64_t output = PredictOutputSize(request, model).pixels() * model.out_channels() * 4;
  e.dense = tiling::DensePeakBytes(memory, latent);
  e.exact_rank = tiling::ExactRankPeakBytes(memory, latent, degree) + output;
  e.floor_tile = tiling::FloorTilePeakBytes(memory, latent) + output;
  return e;
}

namespace {

// Free bytes of every rank, or nullopt when any rank has no measured budget.
std::optional<std::vector<int64_t>> MeasuredFree(const GroupResources& group) {
  if (group.free_bytes_per_rank.empty()) return std::nullopt;
  for (int64_t b : group.free_bytes_per_rank) {
    if (b < 0) return std::nullopt;
  }
  return group.free_bytes_per_rank;
}

std::string MiB(int64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); }

// The tightest rank's capacity, or nullopt when any rank is unbounded or
// none was reported.
std::optional<int64_t> MinCapacity(const GroupResources& group) {
  if (group.capacity_bytes_per_rank.empty()) return std::nullopt;
  for (int64_t b : group.capacity_bytes_per_rank) {
    if (b < 0) return std::nullopt;
  }
  return *std::min_element(group.capacity_bytes_per_rank.begin(), group.capacity_bytes_per_rank.end());
}

}  // namespace

absl::StatusOr<ModeChoice> SelectMode(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                                      const GroupResources& group) {
  const std::optional<std::vector<int64_t>> free = MeasuredFree(group);
  const PeakEstimates need = EstimatePeaks(request, model, group.degree);
  const int64_t leader_free = free ? (*free)[0] : 0;
  const int64_t min_free = free ? *std::min_element(free->begin(), free->end()) : 0;
  const bool exact_possible = group.degree >= 2 && Supports(model, v1::MODE_EXACT);
  switch (request.mode()) {
    case v1::MODE_DENSE:
      if (free && need.dense > leader_free) {
        return absl::FailedPreconditionError(absl::StrCat("mode: DENSE needs about ", MiB(need.dense),
                                                          " but the leader has ", MiB(leader_free),
                                                          " free (use AUTO or TILED)"));
      }
      return ModeChoice{v1::MODE_DENSE, "requested"};
    case v1::MODE_TILED:
      if (!Supports(model, v1::MODE_TILED)) {
        return absl::InvalidArgumentError(absl::StrCat("mode: model \"", model.name(), "\" (", model.family(),
                                                       ") cannot be decoded in TILED mode; it supports ",
                                                       SupportedList(model)));
      }
      return ModeChoice{v1::MODE_TILED, "requested"};
    case v1::MODE_EXACT:
      if (group.degree < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("mode: EXACT needs a worker group of at least 2 ranks; this server's groups have ",
                         group.degree, " (use AUTO or DENSE)"));
      }
      if (!Supports(model, v1::MODE_EXACT)) {
        return absl::InvalidArgumentError(absl::StrCat("mode: model \"", model.name(), "\" (", model.family(),
                                                       ") cannot be decoded in EXACT mode; it supports ",
                                                       SupportedList(model)));
      }
      if (free && need.exact_rank > min_free) {
        return absl::FailedPreconditionError(
            absl::StrCat("mode: EXACT needs about ", MiB(need.exact_rank), " on each of ", group.degree,
                         " ranks but the tightest rank has ", MiB(min_free), " free (use AUTO or TILED)"));
      }
      return ModeChoice{v1::MODE_EXACT, "requested"};
    case v1::MODE_AUTO:
      if (!free) {
        if (exact_possible)
          return ModeChoice{v1::MODE_EXACT, absl::StrCat("auto: exact over ", group.degree, " ranks")};
        if (group.degree < 2) return ModeChoice{v1::MODE_DENSE, "group has one rank"};
        return ModeChoice{v1::MODE_DENSE, absl::StrCat("model family ", model.family(), " cannot shard exactly")};
      }
      if (exact_possible && need.exact_rank <= min_free) {
        return ModeChoice{v1::MODE_EXACT, absl::StrCat("auto: exact over ", group.degree, " ranks (needs ",
                                                       MiB(need.exact_rank), " per rank, ", MiB(min_free), " free)")};
      }
      if (!exact_possible && need.dense <= leader_free) {
        return ModeChoice{v1::MODE_DENSE,
                          absl::StrCat("auto: dense fits (", MiB(need.dense), " of ", MiB(leader_free), " free)")};
      }
      // Every rank decodes tiles: the tightest rank decides.
      if (Supports(model, v1::MODE_TILED) && need.floor_tile <= min_free) {
        return ModeChoice{v1::MODE_TILED,
                          absl::StrCat("auto: tiled; ", exact_possible ? "exact needs " : "dense needs ",
                                       MiB(exact_possible ? need.exact_rank : need.dense), " per rank, ",
                                       MiB(exact_possible ? min_free : leader_free), " free")};
      }
      {
        // The smallest plan: floor tiles, or for a model never tiled
        // (MiniMax-H3) exact bands, or the whole decode.
        const bool tiles = Supports(model, v1::MODE_TILED);
        const int64_t smallest = tiles ? need.floor_tile : exact_possible ? need.exact_rank : need.dense;
        const std::string plan = tiles
                                     ? absl::StrCat(tiling::kFloorTile, "x", tiling::kFloorTile, "-latent floor tiles")
                                 : exact_possible ? absl::StrCat("exact bands over ", group.degree, " ranks")
                                                  : "the whole decode (the model is never tiled)";
        if (const std::optional<int64_t> capacity = MinCapacity(group); capacity && smallest > *capacity) {
          return absl::ResourceExhaustedError(
              absl::StrCat("this latent can never be decoded on this server: its smallest plan (", plan,
                           ", with the output the leader holds) needs about ", MiB(smallest),
                           " per rank, and the tightest rank can give a decode at most ", MiB(*capacity),
                           " (its memory budget less the loaded models); send a smaller latent or batch"));
        }
        return ModeChoice{v1::MODE_DENSE,
                          absl::StrCat("waiting for memory: even ", plan, " needs ", MiB(smallest), ", ", MiB(min_free),
                                       " free on the tightest rank"),
                          /*wait_for_memory=*/true};
      }
    default:
      return absl::InvalidArgumentError(absl::StrCat("mode: unknown value ", static_cast<int>(request.mode())));
  }
}

}  // namespace vaedecode::server
