#include "families/sharded_layer_ops.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/status_error.h"
#include "parallel/sharded_ops.h"

namespace vaedecode::families {
namespace {

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return *std::move(result);
}

}  // namespace

ShardedLayerOps::ShardedLayerOps(parallel::Communicator& comm, parallel::ShardSpec latent_spec)
    : comm_(comm), latent_spec_(std::move(latent_spec)) {}

ShardedLayerOps::ShardedLayerOps(parallel::Communicator& comm, std::vector<parallel::ShardSpec> row_levels)
    : comm_(comm), latent_spec_(row_levels.back()), row_levels_(std::move(row_levels)) {}

parallel::ShardSpec ShardedLayerOps::SpecForRows(int64_t local_rows, int axis) const {
  if (!row_levels_.empty()) {
    for (const parallel::ShardSpec& level : row_levels_) {
      if (level.local_rows() != local_rows) continue;
      parallel::ShardSpec spec = level;
      spec.axis = axis;
      return spec;
    }
    TORCH_CHECK(false, "a band of ", local_rows, " rows is at none of the encoder's row levels");
  }
  const int64_t latent_rows = latent_spec_.local_rows();
  TORCH_CHECK(latent_rows > 0 && local_rows % latent_rows == 0, "a band of ", local_rows,
              " rows is not a whole multiple of the latent band (", latent_rows,
              " rows): the layer does not scale rows uniformly");
  parallel::ShardSpec spec = latent_spec_.Scaled(local_rows / latent_rows);
  spec.axis = axis;
  return spec;
}

at::Tensor ShardedLayerOps::Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const ConvGeometry& g) {
  const int h_axis = static_cast<int>(x.dim()) - 2;
  const int64_t kernel_h = weight.size(weight.dim() - 2);
  const int64_t halo = (kernel_h - 1) / 2 * g.dilation;
  TORCH_CHECK(kernel_h % 2 == 1 && g.padding_h == halo,
              "exact sharding needs a centred odd kernel with 'same' row padding (kernel ", kernel_h, ", padding ",
              g.padding_h, ")");
  TORCH_CHECK(g.mode != PaddingMode::kCircular, "circular padding cannot be sharded by rows");
  const parallel::ShardSpec spec = SpecForRows(x.size(h_axis), h_axis);
  const bool zeros = g.mode == PaddingMode::kZeros;
  const int64_t rows = x.size(h_axis);
  const int64_t pad_top = spec.is_first() ? halo : 0, pad_bottom = spec.is_last() ? halo : 0;
  if (halo > 0 && rows >= 2 * halo && (zeros || overlap_halo_)) {
    // The neighbours' rows travel while this rank convolves what it can
    // without them: the band with zero row padding (exact for every output
    // row but the `halo` rows at an interior edge) or, for other paddings,
    // its interior rows (and the layer's own padding at a global edge).
    // Then the edge rows come from thin slabs of neighbour rows + own rows.
    // Without overlap the same arithmetic runs after the exchange.
    parallel::HaloRowsInFlight in_flight =
        ValueOrThrow(parallel::StartHaloRowsExchange(comm_, x, spec, halo, HaloSignal()));
    std::optional<parallel::HaloRows> neighbours;
    if (!overlap_halo_) {
      neighbours = ValueOrThrow(in_flight.Wait());
      AfterHaloExchange(neighbours->min_signal, neighbours->signals_in);
    }
    // Other paddings: no interior rows when the band is exactly 2·halo
    // rows between two neighbours (the edge slabs cover it).
    const bool has_inner = zeros || rows + pad_top + pad_bottom > 2 * halo;
    at::Tensor inner;
    try {
      if (has_inner) {
        inner = zeros ? ConvInRowBands(x, weight, bias, g, halo, halo)
                      : ConvInRowBands(x, weight, bias, g, pad_top, pad_bottom);
      }
    } catch (...) {
      // The peers are in this exchange too: finish it, so that the group
      // learns of this failure from its own message.
      if (overlap_halo_) (void)in_flight.Wait();
      throw;
    }
    if (overlap_halo_) {
      neighbours = ValueOrThrow(in_flight.Wait());
      AfterHaloExchange(neighbours->min_signal, neighbours->signals_in);
    }
    at::Tensor top, bottom;
    if (neighbours->above.defined()) {
      top = ConvWithRowsProvided(at::cat({neighbours->above, x.narrow(h_axis, 0, 2 * halo)}, h_axis), weight, bias, g);
    }
    if (neighbours->below.defined()) {
      bottom = ConvWithRowsProvided(at::cat({x.narrow(h_axis, rows - 2 * halo, 2 * halo), neighbours->below}, h_axis),
                                    weight, bias, g);
    }
    if (zeros) {
      // Overwrite the edge rows in place: no second copy of the output.
      if (top.defined()) inner.narrow(h_axis, 0, halo).copy_(top);
      if (bottom.defined()) inner.narrow(h_axis, inner.size(h_axis) - halo, halo).copy_(bottom);
      return inner;
    }
    std::vector<at::Tensor> parts;
    if (top.defined()) parts.push_back(top);
    if (inner.defined()) parts.push_back(inner);
    if (bottom.defined()) parts.push_back(bottom);
    return parts.size() == 1 ? parts[0] : at::cat(parts, h_axis);
  }
  std::optional<int64_t> signal = halo > 0 ? HaloSignal() : std::nullopt;
  at::Tensor signals_in;
  at::Tensor with_rows = ValueOrThrow(
      parallel::ExchangeHalo(comm_, x, spec, halo, /*zero_edges=*/zeros, signal ? &*signal : nullptr, &signals_in));
  if (halo > 0) AfterHaloExchange(signal, signals_in);
  // The layer's own padding only at the global edges; interior edges have
  // real neighbour rows (replicate/reflect included).
  // In row bands on a CPU, as the dense path (its peak scales with the band).
  if (!zeros) return ConvInRowBands(with_rows, weight, bias, g, pad_top, pad_bottom);
  return ConvInRowBands(with_rows, weight, bias, g, 0, 0);
}

at::Tensor ShardedLayerOps::StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                        const StridedConvGeometry& g) {
  const int h_axis = static_cast<int>(x.dim()) - 2;
  const int64_t kernel = weight.size(weight.dim() - 2);
  const parallel::ShardSpec in = SpecForRows(x.size(h_axis), h_axis);
  const int64_t out_total = g.OutputRows(in.rows_total(), kernel);
  const parallel::ShardSpec* out = nullptr;
  for (const parallel::ShardSpec& level : row_levels_) {
    if (level.rows_total() == out_total) out = &level;
  }
  TORCH_CHECK(out != nullptr, "a strided convolution to ", out_total, " rows reaches none of the encoder's row levels");
  // Output rows [b, e) read input rows [b·s − top, (e − 1)·s − top + k).
  // What each band needs beyond its own rows, above and below; every rank
  // computes every band's, so all agree on the exchange.
  const auto reach = [&](int r) {
    const parallel::Band o = out->band(r), i = in.band(r);
    TORCH_CHECK(!o.empty() && !i.empty(), "an empty band at a strided convolution");
    const int64_t first = o.begin * g.stride - g.pad_top, end = (o.end - 1) * g.stride - g.pad_top + kernel;
    return std::make_pair(i.begin - first, end - i.end);
  };
  int64_t halo_above = 0, halo_below = 0;
  for (int r = 0; r < in.world_size; ++r) {
    const auto [above, below] = reach(r);
    if (r > 0) halo_above = std::max(halo_above, above);
    if (r + 1 < in.world_size) halo_below = std::max(halo_below, below);
  }
  const parallel::HaloRows neighbours =
      ValueOrThrow(ValueOrThrow(parallel::StartHaloRowsExchange(comm_, x, in, halo_above, halo_below)).Wait());
  const auto [above, below] = reach(in.rank);
  // This band with the neighbour rows its windows read; at a global edge the
  // layer's own padding instead (or fewer rows: the last window may stop short
  // of an odd height's padding row).
  std::vector<at::Tensor> parts;
  int64_t pad_top = 0, pad_bottom = 0;
  if (above > 0 && in.is_first()) pad_top = above;
  if (above > 0 && !in.is_first()) parts.push_back(neighbours.above.narrow(h_axis, halo_above - above, above));
  parts.push_back(above < 0 ? x.narrow(h_axis, -above, x.size(h_axis) + above) : x);
  at::Tensor rows = parts.size() == 1 ? parts[0] : at::cat(parts, h_axis);
  if (below > 0 && in.is_last()) pad_bottom = below;
  if (below > 0 && !in.is_last()) rows = at::cat({rows, neighbours.below.narrow(h_axis, 0, below)}, h_axis);
  if (below < 0) rows = rows.narrow(h_axis, 0, rows.size(h_axis) + below);
  return StridedConvWithRowPadding(rows, weight, bias, g, pad_top, pad_bottom);
}

std::optional<int64_t> ShardedLayerOps::HaloSignal() {
  if (!cancel_with_halo_) return std::nullopt;
  if (pending_halo_words_.has_value()) {
    // The last exchange's words (GPU), long arrived: what this rank learnt there.
    const at::Tensor& words = pending_halo_words_->Wait();
    if (words.numel() > 0) stop_at_exchange_ = std::min(stop_at_exchange_, words.min().item<int64_t>());
    pending_halo_words_.reset();
  }
  if (cancelled_ != nullptr && cancelled_->load() && stop_at_exchange_ == std::numeric_limits<int64_t>::max()) {
    // On a CPU the stop reaches rank k at exchange i + k - 1 (the leader's
    // neighbour gets it with exchange i itself): the last rank, W - 1, at
    // i + W - 2. On a GPU a rank reads an exchange's words only at its
    // next one, so the word moves one rank per exchange from i on: W - 1
    // reaches it at i + W - 1.
    const int world = comm_.world_size();
    stop_at_exchange_ = halo_exchanges_ + (comm_.device().is_cuda() ? std::max(0, world - 1) : std::max(0, world - 2));
  }
  return stop_at_exchange_;
}

void ShardedLayerOps::AfterHaloExchange(std::optional<int64_t> min_signal, const at::Tensor& signals_in) {
  if (!cancel_with_halo_) return;
  if (min_signal.has_value()) stop_at_exchange_ = std::min(stop_at_exchange_, *min_signal);
  if (signals_in.defined()) pending_halo_words_ = device::HostCopy::Start(signals_in);
  if (halo_exchanges_++ >= stop_at_exchange_) throw StatusError(absl::CancelledError("the request was cancelled"));
}

parallel::LeaderSignal ShardedLayerOps::OutgoingSignal() {
  // The word the last collective carried, first: every rank reads it here,
  // at the same op, so all stop together.
  if (pending_signal_.has_value()) {
    const double word = pending_signal_->Wait().item<double>();
    pending_signal_.reset();
    if (word != 0.0) throw StatusError(absl::CancelledError("the request was cancelled"));
  }
  parallel::LeaderSignal signal;
  signal.value = (cancelled_ != nullptr && cancelled_->load()) ? 1.0 : 0.0;
  return signal;
}

void ShardedLayerOps::TakeSignal(const parallel::LeaderSignal& signal) {
  if (!signal.received.defined()) {  // world size 1: this rank is the leader
    if (signal.value != 0.0) throw StatusError(absl::CancelledError("the request was cancelled"));
    return;
  }
  if (signal.received.is_cpu()) {
    if (signal.received.item<double>() != 0.0) throw StatusError(absl::CancelledError("the request was cancelled"));
    return;
  }
  // On a GPU reading it now would wait for everything queued so far: it is
  // read at the next collective that carries one, by then long arrived.
  pending_signal_ = device::HostCopy::Start(signal.received);
}

at::Tensor ShardedLayerOps::GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight,
                                      const at::Tensor& bias, double eps) {
  const int h_axis = static_cast<int>(x.dim()) - 2;
  parallel::LeaderSignal signal = OutgoingSignal();
  at::Tensor y = ValueOrThrow(parallel::ShardedGroupNorm(comm_, x, SpecForRows(x.size(h_axis), h_axis), num_groups,
                                                         weight, bias, eps, &signal, &norm_weights_));
  TakeSignal(signal);
  return y;
}

std::pair<at::Tensor, at::Tensor> ShardedLayerOps::GatherBandKV(const at::Tensor& k, const at::Tensor& v,
                                                                int64_t tokens_per_row) {
  const int64_t local_tokens = k.size(-2);
  TORCH_CHECK(tokens_per_row > 0 && local_tokens % tokens_per_row == 0, "attention tokens are not whole rows");
  const parallel::ShardSpec spec = SpecForRows(local_tokens / tokens_per_row, /*axis=*/0);
  std::vector<int64_t> token_sizes = spec.sizes();
  for (int64_t& s : token_sizes) s *= tokens_per_row;
  parallel::LeaderSignal signal = OutgoingSignal();
  auto kv = ValueOrThrow(parallel::AllGatherKV(comm_, k, v, token_sizes, &signal));
  TakeSignal(signal);
  return kv;
}

at::Tensor ShardedLayerOps::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const TokenLayout& layout) {
  if (layout.kind == TokenLayout::Kind::kFrameCausal) {
    // Local queries against every rank's keys of frames 0..t.
    if (layout.keys_gathered) return FrameCausalScaledDotProductAttention(q, k, v, layout.key_frames_before);
    auto [k_all, v_all] = GatherKeysValues(k, v, layout.tokens_per_row);
    return FrameCausalScaledDotProductAttention(q, k_all, v_all, layout.key_frames_before);
  }
  return FullAttention(q, k, v, layout);
}

at::Tensor ShardedLayerOps::FullAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const TokenLayout& layout) {
  const int64_t shared = layout.shared_tokens;
  if (shared == 0) {
    auto [k_all, v_all] = GatherBandKV(k, v, layout.tokens_per_row);
    // Local queries against every key; the output stays local.
    return ScaledDotProductAttention(q, k_all, v_all);
  }
  const int64_t band = k.size(-2) - shared;
  TORCH_CHECK(shared > 0 && band >= 0, "more shared tokens than tokens");
  auto [k_all, v_all] =
      GatherBandKV(k.narrow(-2, 0, band).contiguous(), v.narrow(-2, 0, band).contiguous(), layout.tokens_per_row);
  return ScaledDotProductAttention(q, at::cat({k_all, k.narrow(-2, band, shared)}, -2),
                                   at::cat({v_all, v.narrow(-2, band, shared)}, -2));
}

RowWindow ShardedLayerOps::GlobalRows(int64_t local_rows) {
  const parallel::ShardSpec spec = SpecForRows(local_rows, /*axis=*/0);
  return {spec.local_band().begin, spec.rows_total()};
}

std::pair<at::Tensor, at::Tensor> ShardedLayerOps::GatherKeysValues(const at::Tensor& k, const at::Tensor& v,
                                                                    int64_t tokens_per_row) {
  // [B, heads, T, N_band, D]: fold frames into the heads dim so that one
  // uneven all-gather along the token dim collects every frame's band.
  const int64_t b = k.size(0), heads = k.size(1), frames = k.size(2), local_tokens = k.size(3), d = k.size(4);
  auto [k_all, v_all] = GatherBandKV(k.reshape({b, heads * frames, local_tokens, d}),
                                     v.reshape({b, heads * frames, local_tokens, d}), tokens_per_row);
  const int64_t tokens = k_all.size(2);
  return {k_all.reshape({b, heads, frames, tokens, d}), v_all.reshape({b, heads, frames, tokens, d})};
}

}  // namespace vaedecode::families
