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
// int64 more per message): a word that spreads one rank per exchange
// (ShardedLayerOps carries the leader's cancellation that way). Every rank of
// the exchange must pass one, or none. On a CPU `min_signal` is then the
// smallest of this rank's and the neighbours' words; on a GPU the words are
// left unread in `signals_in` (reading them would wait for the device).
struct HaloRows {
  at::Tensor above;
  at::Tensor below;
  std::optional<int64_t> min_signal;  // CPU, with a signal
  at::Tensor signals_in;              // GPU, with a signal: the neighbours' words, int64 [n]
};
absl::StatusOr<HaloRows> ExchangeHaloRows(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int64_t halo,
                                          std::optional<int64_t> signal = std::nullopt);

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
absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                                       int64_t halo, std::optional<int64_t> signal = std::nullopt);
// The same with `halo_above` rows from the rank above and `halo_below` from
// the rank below (a strided convolution's window is not centred; a
// direction of 0 rows sends nothing that way but the signal).
absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                                       int64_t halo_above, int64_t halo_below,
                                                       std::optional<int64_t> signal = std::nullopt);

// Returns x with `halo` real rows of the rank above prepended and `halo` rows
// of the rank below appended along spec.axis. At the global top/bottom edges
// nothing is added (the caller pads with the layer's own padding), or, with
// `zero_edges`, `halo` zero rows, so a zero-padded conv needs one copy in all.
// `signal`, when given, as in ExchangeHaloRows: in, this rank's word; out,
// the smallest of its and its neighbours' (CPU), or unchanged with the
// neighbours' words left unread in *signals_in (GPU).
absl::StatusOr<at::Tensor> ExchangeHalo(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int64_t halo,
                                        bool zero_edges = false, int64_t* signal = nullptr,
                                        at::Tensor* signals_in = nullptr);

// A word the leader sends along with a collective (ShardedGroupNorm,
// AllGatherKV), so that every rank learns it at the same layer without a
// collective of its own (the leader's "this job is cancelled"): `value` is
// what this rank puts in (only the leader's travels); `received` the
// leader's value, a one-element tensor on the communicator's device, which
// a caller on a GPU reads without stalling the device (device::HostCopy).
struct LeaderSignal {
  double value = 0;
  at::Tensor received;
};

// The weights of the ranks' GroupNorm statistics in the merge (each rank's
// share of the rows: w_r = n_r / n), as a tensor on the device, built once
// per band layout and kept (a decode has one layout per resolution), so a
// norm copies nothing from the host. Not thread-safe: one per decode.
class GroupNormWeights {
 public:
  const at::Tensor& For(const ShardSpec& spec, const c10::Device& device);

 private:
  std::vector<std::pair<std::vector<int64_t>, at::Tensor>> cache_;
};

// GroupNorm over the whole (sharded) tensor: x is [B, C, ...] with the band
// along spec.axis. One pass reads the band for its local (mean, variance)
// per batch×group with float32 accumulation (float64 for float64 input); the
// [B, G] statistics of every rank are all-gathered in float64 in one
// collective (the counts follow from the partition) and merged:
//   mean = Σ w_i·mean_i,  var = Σ w_i·(var_i + (mean_i − mean)²),  w_i = n_i / n
// (population variance); one fused pass then normalises and applies the
// affine in the input's dtype, computing in float32: y = x·a + b per
// (batch, channel), as LibTorch's own GroupNorm kernels do. So the band is
// read twice and written once, as by the dense op; no float32 copy of a
// bfloat16 band (on a GPU). On a CPU the statistics come from LibTorch's
// fused GroupNorm kernel, whose locally normalised output is re-normalised
// in place (measured: var_mean plus an out-of-place apply was 3x slower on
// one thread). `weight`/`bias` may be undefined (no affine). `weights`
// caches the merge weights (a temporary when null).
absl::StatusOr<at::Tensor> ShardedGroupNorm(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                            int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                                            double eps, LeaderSignal* leader_signal = nullptr,
                                            GroupNormWeights* weights = nullptr);

// K and V of every rank, stacked into one uneven all-gather along the token
// dim (-2 of [B, heads, N, D]); `token_sizes[r]` tokens come from rank r.
// Returns (K_global, V_global) with no transport padding.
// `leader_signal` rides in one extra row from the leader.
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> AllGatherKV(Communicator& comm, const at::Tensor& k,
                                                              const at::Tensor& v,
                                                              absl::Span<const int64_t> token_sizes,
                                                              LeaderSignal* leader_signal = nullptr);

// The decoded rows of every rank concatenated along spec.axis on `root`;
// an undefined tensor on the other ranks.
absl::StatusOr<at::Tensor> GatherRowsToRoot(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int root);

}  // namespace vaedecode::parallel
