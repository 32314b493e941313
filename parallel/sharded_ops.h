#pragma once

// The exact-sharding operators: each runs on one rank's row band and, with the
// group, reproduces the unsharded op on the whole tensor (up to floating-point
// reduction order). They talk only to the Communicator interface and take the
// band layout explicitly (ShardSpec); none communicates what a rank can
// compute from the partition. At world size 1 none makes a call.

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "parallel/band_partition.h"
#include "parallel/communicator.h"

namespace vaedecode::parallel {

// The neighbours' rows alone: `halo` rows from the rank above and below
// (undefined at the global edges), in one SendRecv batch. Every band must
// hold >= halo rows (FAILED_PRECONDITION otherwise).
//
// `signal`, when given, travels to both neighbours in the same batch (one
// int64 more per message) and `min_signal` is the smallest of this rank's
// and theirs: a word that spreads one rank per exchange (ShardedOps carries
// the leader's cancellation that way). Every rank of the exchange must pass
// one, or none.
struct HaloRows {
  at::Tensor above;
  at::Tensor below;
  std::optional<int64_t> min_signal;  // set when a signal was given
};
absl::StatusOr<HaloRows> ExchangeHaloRows(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                          int64_t halo, std::optional<int64_t> signal = std::nullopt);

// The same exchange in flight (Communicator::StartSendRecv): `x` may be
// read meanwhile, and the rows are there once Wait() returns OK.
class HaloRowsInFlight {
 public:
  HaloRowsInFlight() = default;
  // `signals_in`: the neighbours' signal words being received (undefined
  // where there is no neighbour or no signal).
  HaloRowsInFlight(HaloRows rows, std::unique_ptr<PendingSendRecv> pending, std::vector<at::Tensor> signals_in = {})
      : rows_(std::move(rows)), pending_(std::move(pending)), signals_in_(std::move(signals_in)) {}
  absl::StatusOr<HaloRows> Wait();

 private:
  HaloRows rows_;
  std::unique_ptr<PendingSendRecv> pending_;  // null when nothing travels
  std::vector<at::Tensor> signals_in_;
};
absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x,
                                                       const ShardSpec& spec, int64_t halo,
                                                       std::optional<int64_t> signal = std::nullopt);

// Returns x with `halo` real rows of the rank above prepended and `halo` rows
// of the rank below appended along spec.axis. At the global top/bottom edges
// nothing is added (the caller pads with the layer's own padding), or, with
// `zero_edges`, `halo` zero rows, so a zero-padded conv needs one copy in all.
// `signal`, when given, as in ExchangeHaloRows: in, this rank's word; out,
// the smallest of its and its neighbours'.
absl::StatusOr<at::Tensor> ExchangeHalo(Communicator& comm, const at::Tensor& x,
                                        const ShardSpec& spec, int64_t halo,
                                        bool zero_edges = false, int64_t* signal = nullptr);

// GroupNorm over the whole (sharded) tensor: x is [B, C, ...] with the band
// along spec.axis. LibTorch's fused GroupNorm kernel normalises the band with
// its local statistics (one pass, as the dense op); per batch×group the
// local (mean, M2) — the count is known from the partition — are
// all-gathered in FP64 in one collective and merged:
//   mean = Σ w_i·mean_i,  var = Σ w_i·(var_i + (mean_i − mean)²),  w_i = n_i / n
// (population variance); one in-place pass then re-normalises with the
// group's statistics and applies the affine. Accumulation is FP32, FP64 for
// FP64 input. `weight`/`bias` may be undefined (no affine).
//
// `leader_signal`, when given, rides along in the same collective: every
// rank reads the value the leader put there (e.g. "this job is cancelled"),
// so all ranks learn it at the same layer without an extra collective.
absl::StatusOr<at::Tensor> ShardedGroupNorm(Communicator& comm, const at::Tensor& x,
                                            const ShardSpec& spec, int64_t num_groups,
                                            const at::Tensor& weight, const at::Tensor& bias,
                                            double eps, double* leader_signal = nullptr);

// K and V of every rank, stacked into one uneven all-gather along the token
// dim (-2 of [B, heads, N, D]); `token_sizes[r]` tokens come from rank r.
// Returns (K_global, V_global) with no transport padding.
// `leader_signal` as in ShardedGroupNorm (one extra row from the leader).
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> AllGatherKV(Communicator& comm,
                                                              const at::Tensor& k,
                                                              const at::Tensor& v,
                                                              absl::Span<const int64_t> token_sizes,
                                                              double* leader_signal = nullptr);

// The decoded rows of every rank concatenated along spec.axis on `root`;
// an undefined tensor on the other ranks.
absl::StatusOr<at::Tensor> GatherRowsToRoot(Communicator& comm, const at::Tensor& x,
                                            const ShardSpec& spec, int root);

}  // namespace vaedecode::parallel
