#include "parallel/sharded_ops.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::parallel {
namespace {

// [.., rows at axis, ..] -> rows first, so the communicator's dim-0 ops apply.
at::Tensor RowsFirst(const at::Tensor& x, int64_t axis) { return x.movedim(axis, 0).contiguous(); }

}  // namespace

absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                                       int64_t halo, std::optional<int64_t> signal) {
  return StartHaloRowsExchange(comm, x, spec, halo, halo, signal);
}

absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                                       int64_t halo_above, int64_t halo_below,
                                                       std::optional<int64_t> signal) {
  HaloRows rows;
  rows.min_signal = signal;
  if ((halo_above == 0 && halo_below == 0) || spec.world_size == 1) return HaloRowsInFlight(rows, nullptr);
  const int64_t halo = std::max(halo_above, halo_below);
  if (halo_above < 0 || halo_below < 0 || spec.min_band_rows() < halo) {
    return absl::FailedPreconditionError(
        absl::StrCat("halo of ", halo, " rows exceeds the thinnest band (", spec.min_band_rows(), " rows)"));
  }
  const int64_t axis = spec.axis;
  const int64_t local_rows = x.size(axis);
  const auto rows_shape = [&](int64_t n) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape[axis] = n;
    return shape;
  };
  std::vector<P2POp> ops;
  std::vector<at::Tensor> signals_in;
  // Per neighbour: the rows (none in a direction whose halo is 0), then
  // (with a signal) the word; both ends post them in this order, so the
  // messages pair up.
  const auto with_neighbour = [&](int peer, const at::Tensor& rows_out, int64_t rows_in_count, at::Tensor& rows_in) {
    if (rows_out.size(axis) > 0) ops.push_back({P2POp::kSend, peer, rows_out});
    if (rows_in_count > 0) {
      rows_in = at::empty(rows_shape(rows_in_count), x.options());
      ops.push_back({P2POp::kRecv, peer, rows_in});
    }
    if (!signal.has_value()) return;
    ops.push_back({P2POp::kSend, peer, at::full({1}, *signal, x.options().dtype(at::kLong))});
    signals_in.push_back(at::empty({1}, x.options().dtype(at::kLong)));
    ops.push_back({P2POp::kRecv, peer, signals_in.back()});
  };
  // The rank above takes this band's first rows as its rows below; the rank
  // below takes the last ones as its rows above.
  if (!spec.is_first()) {
    with_neighbour(spec.rank - 1, x.narrow(axis, 0, halo_below).contiguous(), halo_above, rows.above);
  }
  if (!spec.is_last()) {
    with_neighbour(spec.rank + 1, x.narrow(axis, local_rows - halo_above, halo_above).contiguous(), halo_below,
                   rows.below);
  }
  // The send tensors are copies of x's edge rows, and the posted batch
  // holds every tensor it moves until it completes.
  return HaloRowsInFlight(std::move(rows), comm.StartSendRecv(ops, CallKind::kHalo), std::move(signals_in));
}

absl::StatusOr<HaloRows> HaloRowsInFlight::Wait() {
  if (pending_ != nullptr) {
    std::unique_ptr<PendingSendRecv> pending = std::move(pending_);
    RETURN_IF_ERROR(pending->Wait());
  }
  if (!signals_in_.empty()) {
    if (signals_in_[0].is_cpu()) {
      for (const at::Tensor& word : signals_in_) rows_.min_signal = std::min(*rows_.min_signal, word.item<int64_t>());
    } else {
      rows_.signals_in = at::cat(signals_in_);
    }
  }
  return std::move(rows_);
}

absl::StatusOr<HaloRows> ExchangeHaloRows(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int64_t halo,
                                          std::optional<int64_t> signal) {
  ASSIGN_OR_RETURN(HaloRowsInFlight started, StartHaloRowsExchange(comm, x, spec, halo, signal));
  return started.Wait();
}

absl::StatusOr<at::Tensor> ExchangeHalo(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int64_t halo,
                                        bool zero_edges, int64_t* signal, at::Tensor* signals_in) {
  if (halo == 0) return x;
  std::optional<int64_t> word;
  if (signal != nullptr) word = *signal;
  ASSIGN_OR_RETURN(HaloRows rows, ExchangeHaloRows(comm, x, spec, halo, word));
  if (signal != nullptr && rows.min_signal.has_value()) *signal = *rows.min_signal;
  if (signals_in != nullptr) *signals_in = rows.signals_in;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[spec.axis] = halo;
  if (zero_edges) {
    if (!rows.above.defined()) rows.above = at::zeros(shape, x.options());
    if (!rows.below.defined()) rows.below = at::zeros(shape, x.options());
  }
  std::vector<at::Tensor> parts;
  if (rows.above.defined()) parts.push_back(rows.above);
  parts.push_back(x);
  if (rows.below.defined()) parts.push_back(rows.below);
  return parts.size() == 1 ? x : at::cat(parts, spec.axis);
}

const at::Tensor& GroupNormWeights::For(const ShardSpec& spec, const c10::Device& device) {
  const std::vector<int64_t> sizes = spec.sizes();
  for (const auto& [key, weights] : cache_) {
    if (key == sizes && weights.device() == device) return weights;
  }
  std::vector<double> shares;
  for (int64_t rows : sizes) shares.push_back(static_cast<double>(rows) / static_cast<double>(spec.rows_total()));
  cache_.emplace_back(sizes, at::tensor(shares, at::kDouble).to(device));
  return cache_.back().second;
}

namespace {

// Per batch×group (mean, population variance) of x's elements, [B, G] each,
// in one read of x with float32 accumulation (float64 for float64 input).
// On a GPU; the CPU path below takes them from LibTorch's GroupNorm kernel.
std::pair<at::Tensor, at::Tensor> GroupMoments(const at::Tensor& x, int64_t num_groups, double eps) {
  const at::Tensor groups = x.view({x.size(0), num_groups, -1});
  if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) {
    auto [var, mean] = at::var_mean(groups, at::IntArrayRef{2}, /*correction=*/at::Scalar(0), /*keepdim=*/false);
    return {mean, var};
  }
  // Reduced precision: the batch-norm statistics kernel reads it once and
  // accumulates in float32 (each batch×group a "channel"); it returns
  // 1/√(var + eps).
  auto [mean, invstd] = at::batch_norm_stats(groups.reshape({1, -1, groups.size(2)}), eps);
  const at::Tensor var = (invstd.square().reciprocal() - eps).clamp_min(0);
  return {mean.view({x.size(0), num_groups}), var.view({x.size(0), num_groups})};
}

// The group's (mean, variance) [B, G] from every rank's local ones: one
// all-gather of [2·B·G + 1] float64 values (means, variances, the leader's
// word), merged with each rank's share of the rows. Float64 out.
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> MergeMoments(Communicator& comm, const ShardSpec& spec,
                                                               const at::Tensor& mean_local,
                                                               const at::Tensor& var_local, LeaderSignal* leader_signal,
                                                               GroupNormWeights* weights) {
  const int64_t batch = mean_local.size(0), num_groups = mean_local.size(1);
  const int64_t bg = batch * num_groups;
  const at::Tensor stats =
      at::cat({mean_local.flatten().to(at::kDouble), var_local.flatten().to(at::kDouble),
               at::full({1}, leader_signal ? leader_signal->value : 0.0, mean_local.options().dtype(at::kDouble))})
          .unsqueeze(0);
  std::vector<int64_t> ones(spec.world_size, 1);
  ASSIGN_OR_RETURN(at::Tensor gathered, comm.AllGather(stats, ones, CallKind::kGroupNormStats));
  if (leader_signal != nullptr) leader_signal->received = (gathered)[0].narrow(0, 2 * bg, 1);
  const at::Tensor all = gathered.narrow(1, 0, 2 * bg).view({spec.world_size, 2, batch, num_groups});
  GroupNormWeights temporary;
  const at::Tensor w = (weights != nullptr ? *weights : temporary).For(spec, mean_local.device()).view({-1, 1, 1});
  const at::Tensor means = all.select(1, 0);  // [W, B, G]
  at::Tensor mean = (w * means).sum(0);
  at::Tensor var = (w * (all.select(1, 1) + (means - mean.unsqueeze(0)).square())).sum(0);
  return std::make_pair(std::move(mean), std::move(var));
}

// [B, G] per group → [B·C] per channel.
at::Tensor PerChannel(const at::Tensor& per_group, int64_t channels, at::ScalarType dtype) {
  const int64_t per_group_channels = channels / per_group.size(1);
  return per_group.to(dtype).repeat_interleave(per_group_channels, /*dim=*/1).flatten();
}

}  // namespace

absl::StatusOr<at::Tensor> ShardedGroupNorm(Communicator& comm, const at::Tensor& x_in, const ShardSpec& spec,
                                            int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                                            double eps, LeaderSignal* leader_signal, GroupNormWeights* weights) {
  const at::Tensor x = x_in.contiguous();
  const int64_t batch = x.size(0), channels = x.size(1);
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (!x.is_cuda()) {
    // On a CPU, LibTorch's fused GroupNorm kernel is the fast statistics
    // pass (its Welford-free sums beat var_mean ~3x on one thread) and its
    // output, the band normalised with its local statistics (ŷ), is
    // re-normalised in place with the group's: y = ŷ·a + b per channel,
    // a = γ·rstd/rstd_local, b = β + γ·(mean_local − mean)·rstd (no large
    // terms cancel). Out-of-place passes cost more than the arithmetic here
    // (fresh pages), so the result reuses ŷ's memory.
    const at::Tensor input = x.to(acc);
    const int64_t spatial = input.numel() / std::max<int64_t>(1, batch * channels);
    auto [normalised, mean_acc, rstd_acc] =
        at::native_group_norm(input, c10::nullopt, c10::nullopt, batch, channels, spatial, num_groups, eps);
    if (spec.world_size == 1 && !weight.defined() && !bias.defined()) return normalised.to(x.scalar_type());
    const at::Tensor mean_local = mean_acc.to(at::kDouble).view({batch, num_groups});
    const at::Tensor rstd_local = rstd_acc.to(at::kDouble).view({batch, num_groups});
    at::Tensor mean = mean_local, rstd = rstd_local;
    if (spec.world_size > 1) {
      const at::Tensor var_local = (rstd_local.square().reciprocal() - eps).clamp_min(0);
      ASSIGN_OR_RETURN(auto merged, MergeMoments(comm, spec, mean_local, var_local, leader_signal, weights));
      mean = merged.first;
      rstd = (merged.second + eps).rsqrt();
    }
    at::Tensor scale = PerChannel(rstd / rstd_local, channels, at::kDouble).view({batch, channels});
    at::Tensor shift = PerChannel((mean_local - mean) * rstd, channels, at::kDouble).view({batch, channels});
    if (weight.defined()) {
      const at::Tensor gamma = weight.to(at::kDouble).unsqueeze(0);
      scale = scale * gamma;
      shift = shift * gamma;
    }
    if (bias.defined()) shift = shift + bias.to(at::kDouble).unsqueeze(0);
    std::vector<int64_t> per_channel = {batch, channels};
    per_channel.resize(x.dim(), 1);
    normalised.mul_(scale.to(acc).view(per_channel)).add_(shift.to(acc).view(per_channel));
    return normalised.to(x.scalar_type());
  }

  // On a GPU: one statistics pass with float32 accumulation, then one fused
  // apply from x.
  auto [mean_local, var_local] = GroupMoments(x, num_groups, eps);
  at::Tensor mean = mean_local, var = var_local;  // [B, G]
  if (spec.world_size > 1) {
    ASSIGN_OR_RETURN(auto merged, MergeMoments(comm, spec, mean_local, var_local, leader_signal, weights));
    mean = merged.first;
    var = merged.second;
  }
  // Normalise and apply the affine in one pass: batch norm's inference
  // kernel, each (batch, channel) a channel of [1, B·C, rest], computes
  // y = x·a + b in float32 (float64) with a = γ/√(var + eps), b = β − mean·a,
  // and writes the input's dtype.
  const at::Tensor gamma = weight.defined() ? weight.to(acc).repeat({batch}) : at::Tensor();
  const at::Tensor beta = bias.defined() ? bias.to(acc).repeat({batch}) : at::Tensor();
  auto [y, unused_mean, unused_invstd] =
      at::native_batch_norm(x.view({1, batch * channels, -1}), gamma, beta, PerChannel(mean, channels, acc),
                            PerChannel(var, channels, acc), /*training=*/false, /*momentum=*/0.0, eps);
  return y.view(x.sizes());
}

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> AllGatherKV(Communicator& comm, const at::Tensor& k,
                                                              const at::Tensor& v,
                                                              absl::Span<const int64_t> token_sizes,
                                                              LeaderSignal* leader_signal) {
  if (comm.world_size() == 1) return std::make_pair(k, v);
  const int64_t token_dim = k.dim() - 2;
  // One collective for both: [N, 2, B, heads, D].
  at::Tensor kv = RowsFirst(at::stack({k, v}), token_dim + 1);
  std::vector<int64_t> sizes(token_sizes.begin(), token_sizes.end());
  if (leader_signal != nullptr) {
    // The leader appends one extra row whose first value is its signal.
    sizes[0] += 1;
    if (comm.rank() == 0) {
      at::Tensor extra = at::zeros({1, kv.size(1), kv.size(2), kv.size(3), kv.size(4)}, kv.options());
      extra.view({-1})[0] = leader_signal->value;
      kv = at::cat({kv, extra});
    }
  }
  ASSIGN_OR_RETURN(at::Tensor all, comm.AllGather(kv, sizes, CallKind::kAttentionKV));
  at::Tensor rows = all;
  if (leader_signal != nullptr) {
    // A copy: a view would keep the whole gathered K/V alive until read.
    leader_signal->received = rows[token_sizes[0]].view({-1}).narrow(0, 0, 1).clone();
    rows = at::cat(
        {rows.narrow(0, 0, token_sizes[0]), rows.narrow(0, token_sizes[0] + 1, rows.size(0) - token_sizes[0] - 1)});
  }
  const at::Tensor back = rows.movedim(0, token_dim + 1);  // [2, B, heads, N_total, D]
  return std::make_pair(back.select(0, 0), back.select(0, 1));
}

absl::StatusOr<at::Tensor> GatherRowsToRoot(Communicator& comm, const at::Tensor& x, const ShardSpec& spec, int root) {
  if (spec.world_size == 1) return x;
  ASSIGN_OR_RETURN(at::Tensor all,
                   comm.GatherToRoot(RowsFirst(x, spec.axis), spec.sizes(), root, CallKind::kGatherOutput));
  if (!all.defined()) return at::Tensor();
  return all.movedim(0, spec.axis).contiguous();
}

}  // namespace vaedecode::parallel
