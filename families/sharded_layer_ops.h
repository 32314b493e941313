#pragma once

// LayerOps that run each row-coupled op on this rank's row band with the
// exact-sharding operators of parallel/: halo convolution, merged GroupNorm
// statistics, all-gathered K/V attention. A decoder run with these ops on its
// latent band, on every rank of a group, yields its band of the dense output.
//
// The band layout of any activation follows from the latent's: every layer
// keeps or scales rows uniformly (nearest / pixel-shuffle upsampling), so the
// current layout is latent_spec scaled by local rows / local latent rows.
//
// A communicator failure inside an op throws StatusError (caught by the
// worker's job wrapper). Not thread-safe; one decode at a time.

#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "device/host_copy.h"
#include "families/layer_ops.h"
#include "parallel/band_partition.h"
#include "parallel/communicator.h"
#include "parallel/sharded_ops.h"

namespace vaedecode::families {

class ShardedLayerOps final : public LayerOps {
 public:
  // `latent_spec`: this rank's view of the latent's row bands. `comm` must
  // outlive the ops and belong to the same group.
  ShardedLayerOps(parallel::Communicator& comm, parallel::ShardSpec latent_spec);

  // For an encoder, whose resolutions are not whole multiples of one band
  // (each stride-2 level floors, and the last band takes the remainder):
  // this rank's view of every resolution the activations pass through,
  // `row_levels` (EncodeRowLevels), from the input's rows to the latent's.
  // A tensor's layout is the level whose local band has its rows (bands
  // shrink strictly from level to level, so the match is unique).
  ShardedLayerOps(parallel::Communicator& comm, std::vector<parallel::ShardSpec> row_levels);

  at::Tensor Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvGeometry& geometry) override;
  at::Tensor GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) override;
  // The output band of the next row level from this band plus the rows its
  // windows reach across the band edges (one asymmetric halo exchange); the
  // geometry's padding only at the global edges.
  at::Tensor StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const StridedConvGeometry& geometry) override;
  // Local queries against every rank's band of K/V, gathered in one
  // all-gather (every frame's band at once for a frame-causal layout); a
  // full layout's shared tokens' K/V come from this rank's copy (identical
  // on every rank).
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override;

  RowWindow GlobalRows(int64_t local_rows) override;
  // Every frame's band of K/V in one all-gather (the leader's cancel word
  // rides it, as an attention's gather).
  std::pair<at::Tensor, at::Tensor> GatherKeysValues(const at::Tensor& k, const at::Tensor& v,
                                                     int64_t tokens_per_row) override;
  bool HoldsRowBand() const override { return true; }

  // The layout of a tensor holding `local_rows` rows of this rank's band.
  parallel::ShardSpec SpecForRows(int64_t local_rows, int axis) const;

  // Leader: when *cancelled becomes true, every rank of the group throws
  // StatusError(CANCELLED) at the next GroupNorm or attention, together (the
  // flag rides in that op's all-gather), so the group stays in step; on a
  // GPU at the one after (the word is read without waiting for the device,
  // when the next one starts). Peers pass nothing.
  void set_cancel_flag(const std::atomic<bool>* cancelled) { cancelled_ = cancelled; }

  // Every rank, for a decoder with few or no GroupNorm/attention collectives
  // (ModelInfo::cancel_with_halo): the leader's flag also travels with the
  // halo rows. A halo exchange only reaches the neighbours, so the leader,
  // seeing the flag before exchange i, names exchange i + W - 2 as the stop;
  // each exchange carries the earliest stop a rank knows one rank further,
  // every rank knows it by then, and all throw CANCELLED after that exchange.
  void set_cancel_with_halo(bool on) { cancel_with_halo_ = on; }

  // Whether a convolution computes its rows that need no neighbour rows
  // while the halo rows are in flight (the default), or waits for the halo
  // first (for measuring what the overlap gains; both are exact).
  void set_overlap_halo(bool overlap) { overlap_halo_ = overlap; }

 private:
  // Every rank's band of K/V (`tokens_per_row` per row) in rank order, with
  // the cancellation flag riding along.
  // The word this rank sends with its next halo rows (the earliest stop it
  // knows), or none when the cancellation does not ride the halo.
  std::optional<int64_t> HaloSignal();
  // After a halo exchange: learn the neighbours' stop (a CPU's `min_signal`
  // now; a GPU's `signals_in` at the next exchange) and throw CANCELLED if
  // this exchange is it.
  void AfterHaloExchange(std::optional<int64_t> min_signal, const at::Tensor& signals_in);

  // The leader's word for the next GroupNorm or K/V gather, after reading
  // the last one's (throws CANCELLED when it was up).
  parallel::LeaderSignal OutgoingSignal();
  // The word a collective carried: read now (CPU) or at the next one (GPU).
  void TakeSignal(const parallel::LeaderSignal& signal);

  std::pair<at::Tensor, at::Tensor> GatherBandKV(const at::Tensor& k, const at::Tensor& v, int64_t tokens_per_row);
  at::Tensor FullAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const TokenLayout& layout);

  parallel::Communicator& comm_;
  parallel::ShardSpec latent_spec_;
  std::vector<parallel::ShardSpec> row_levels_;  // encoders: every resolution's layout
  const std::atomic<bool>* cancelled_ = nullptr;
  bool overlap_halo_ = true;
  bool cancel_with_halo_ = false;
  int64_t halo_exchanges_ = 0;  // in this decode, on every rank alike
  int64_t stop_at_exchange_ = std::numeric_limits<int64_t>::max();
  parallel::GroupNormWeights norm_weights_;             // per band layout, on the device
  std::optional<device::HostCopy> pending_signal_;      // a GPU collective's word, not read yet
  std::optional<device::HostCopy> pending_halo_words_;  // a GPU halo exchange's words, not read yet
};

}  // namespace vaedecode::families
