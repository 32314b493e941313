#include "parallel/sharded_ops.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace vaedecode::parallel {
namespace {

// [.., rows at axis, ..] -> rows first, so the communicator's dim-0 ops apply.
at::Tensor RowsFirst(const at::Tensor& x, int64_t axis) { return x.movedim(axis, 0).contiguous(); }

}  // namespace

absl::StatusOr<HaloRowsInFlight> StartHaloRowsExchange(Communicator& comm, const at::Tensor& x,
                                                       const ShardSpec& spec, int64_t halo,
                                                       std::optional<int64_t> signal) {
  HaloRows rows;
  rows.min_signal = signal;
  if (halo == 0 || spec.world_size == 1) return HaloRowsInFlight(rows, nullptr);
  if (spec.min_band_rows() < halo) {
    return absl::FailedPreconditionError(absl::StrCat("halo of ", halo, " rows exceeds the thinnest band (",
                                                      spec.min_band_rows(), " rows)"));
  }
  const int64_t axis = spec.axis;
  const int64_t local_rows = x.size(axis);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[axis] = halo;
  std::vector<P2POp> ops;
  std::vector<at::Tensor> signals_in;
  // Per neighbour: the rows, then (with a signal) the word; both ends post
  // them in this order, so the messages pair up.
  const auto with_neighbour = [&](int peer, const at::Tensor& rows_out, at::Tensor& rows_in) {
    ops.push_back({P2POp::kSend, peer, rows_out});
    rows_in = at::empty(shape, x.options());
    ops.push_back({P2POp::kRecv, peer, rows_in});
    if (!signal.has_value()) return;
    ops.push_back({P2POp::kSend, peer, at::full({1}, *signal, x.options().dtype(at::kLong))});
    signals_in.push_back(at::empty({1}, x.options().dtype(at::kLong)));
    ops.push_back({P2POp::kRecv, peer, signals_in.back()});
  };
  if (!spec.is_first()) with_neighbour(spec.rank - 1, x.narrow(axis, 0, halo).contiguous(), rows.above);
  if (!spec.is_last()) with_neighbour(spec.rank + 1, x.narrow(axis, local_rows - halo, halo).contiguous(), rows.below);
  // The send tensors are copies of x's edge rows, and the posted batch
  // holds every tensor it moves until it completes.
  return HaloRowsInFlight(std::move(rows), comm.StartSendRecv(ops, CallKind::kHalo), std::move(signals_in));
}

absl::StatusOr<HaloRows> HaloRowsInFlight::Wait() {
  if (pending_ != nullptr) {
    std::unique_ptr<PendingSendRecv> pending = std::move(pending_);
    if (absl::Status status = pending->Wait(); !status.ok()) return status;
  }
  for (const at::Tensor& word : signals_in_) {
    rows_.min_signal = std::min(*rows_.min_signal, word.item<int64_t>());
  }
  return std::move(rows_);
}

absl::StatusOr<HaloRows> ExchangeHaloRows(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                          int64_t halo, std::optional<int64_t> signal) {
  absl::StatusOr<HaloRowsInFlight> started = StartHaloRowsExchange(comm, x, spec, halo, signal);
  if (!started.ok()) return started.status();
  return started->Wait();
}

absl::StatusOr<at::Tensor> ExchangeHalo(Communicator& comm, const at::Tensor& x, const ShardSpec& spec,
                                        int64_t halo, bool zero_edges, int64_t* signal) {
  if (halo == 0) return x;
  std::optional<int64_t> word;
  if (signal != nullptr) word = *signal;
  absl::StatusOr<HaloRows> rows = ExchangeHaloRows(comm, x, spec, halo, word);
  if (!rows.ok()) return rows.status();
  if (signal != nullptr) *signal = *rows->min_signal;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[spec.axis] = halo;
  if (zero_edges) {
    if (!rows->above.defined()) rows->above = at::zeros(shape, x.options());
    if (!rows->below.defined()) rows->below = at::zeros(shape, x.options());
  }
  std::vector<at::Tensor> parts;
  if (rows->above.defined()) parts.push_back(rows->above);
  parts.push_back(x);
  if (rows->below.defined()) parts.push_back(rows->below);
  return parts.size() == 1 ? x : at::cat(parts, spec.axis);
}

absl::StatusOr<at::Tensor> ShardedGroupNorm(Communicator& comm, const at::Tensor& x,
                                            const ShardSpec& spec, int64_t num_groups,
                                            const at::Tensor& weight, const at::Tensor& bias,
                                            double eps, double* leader_signal) {
  const int64_t batch = x.size(0), channels = x.size(1);
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // LibTorch's own fused GroupNorm kernel on the band, without the affine:
  // it returns the band normalised with its local statistics (ŷ) and those
  // statistics (mean, rstd per batch×group), in one pass as the dense op
  // does. The [B, G] statistics go to fp64 for the merge.
  const at::Tensor input = x.contiguous().to(acc);
  const int64_t spatial = input.numel() / std::max<int64_t>(1, batch * channels);
  const int64_t n_local = spatial * (channels / num_groups);
  auto [normalised, mean_acc, rstd_acc] =
      at::native_group_norm(input, c10::nullopt, c10::nullopt, batch, channels, spatial, num_groups, eps);
  const at::Tensor mean_local = mean_acc.to(at::kDouble).view({batch, num_groups});
  const at::Tensor rstd_local = rstd_acc.to(at::kDouble).view({batch, num_groups});
  const at::Tensor m2_local =
      (rstd_local.square().reciprocal() - eps).clamp_min(0) * static_cast<double>(n_local);

  at::Tensor mean, var;  // fp64, [B, G]
  if (spec.world_size == 1) {
    mean = mean_local;
    var = m2_local / static_cast<double>(n_local);
  } else {
    // Each rank's count follows from its band (elements per row are equal
    // on every rank), so only (mean, M2) travel: one collective per norm.
    const int64_t per_row = n_local / spec.local_rows();
    const int64_t bg = batch * num_groups;
    // [1, 2·B·G + 1]: means, M2s, and the leader's signal word.
    const at::Tensor stats =
        at::cat({mean_local.flatten(), m2_local.flatten(),
                 at::full({1}, leader_signal ? *leader_signal : 0.0, mean_local.options())})
            .unsqueeze(0);
    std::vector<int64_t> ones(spec.world_size, 1);
    absl::StatusOr<at::Tensor> gathered = comm.AllGather(stats, ones, CallKind::kGroupNormStats);
    if (!gathered.ok()) return gathered.status();
    if (leader_signal != nullptr) *leader_signal = (*gathered)[0][2 * bg].item<double>();
    const at::Tensor all = gathered->narrow(1, 0, 2 * bg).view({spec.world_size, 2, batch, num_groups});
    std::vector<double> counts;
    double total = 0;
    for (int r = 0; r < spec.world_size; ++r) {
      counts.push_back(static_cast<double>(spec.band(r).size() * per_row));
      total += counts.back();
    }
    const at::Tensor n_r = at::tensor(counts, at::kDouble).to(mean_local.device()).view({-1, 1, 1});  // [W, 1, 1]
    const at::Tensor means = all.select(1, 0);  // [W, B, G]
    const at::Tensor m2s = all.select(1, 1);
    const at::Tensor w = n_r / total;
    mean = (w * means).sum(0);
    var = (w * (m2s / n_r + (means - mean.unsqueeze(0)).square())).sum(0);
  }
  // Re-normalise with the group's statistics, in place, one fused pass:
  // y = ŷ·(rstd/rstd_local)·γ + (mean_local − mean)·rstd·γ + β
  // (x − mean = (x − mean_local) + (mean_local − mean): no large terms cancel).
  const int64_t per_group = channels / num_groups;
  const at::Tensor rstd = (var + eps).rsqrt();
  at::Tensor scale = (rstd / rstd_local).repeat_interleave(per_group, /*dim=*/1);                  // [B, C]
  at::Tensor shift = ((mean_local - mean) * rstd).repeat_interleave(per_group, /*dim=*/1);         // [B, C]
  if (weight.defined()) {
    const at::Tensor gamma = weight.to(at::kDouble).unsqueeze(0);
    scale = scale * gamma;
    shift = shift * gamma;
  }
  if (bias.defined()) shift = shift + bias.to(at::kDouble).unsqueeze(0);
  std::vector<int64_t> per_channel(x.dim(), 1);
  per_channel[0] = batch;
  per_channel[1] = channels;
  normalised.mul_(scale.to(acc).view(per_channel)).add_(shift.to(acc).view(per_channel));
  return normalised.to(x.scalar_type());
}

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> AllGatherKV(Communicator& comm,
                                                              const at::Tensor& k,
                                                              const at::Tensor& v,
                                                              absl::Span<const int64_t> token_sizes,
                                                              double* leader_signal) {
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
      extra.view({-1})[0] = *leader_signal;
      kv = at::cat({kv, extra});
    }
  }
  absl::StatusOr<at::Tensor> all = comm.AllGather(kv, sizes, CallKind::kAttentionKV);
  if (!all.ok()) return all.status();
  at::Tensor rows = *all;
  if (leader_signal != nullptr) {
    *leader_signal = rows[token_sizes[0]].view({-1})[0].item<double>();
    rows = at::cat({rows.narrow(0, 0, token_sizes[0]), rows.narrow(0, token_sizes[0] + 1, rows.size(0) - token_sizes[0] - 1)});
  }
  const at::Tensor back = rows.movedim(0, token_dim + 1);  // [2, B, heads, N_total, D]
  return std::make_pair(back.select(0, 0), back.select(0, 1));
}

absl::StatusOr<at::Tensor> GatherRowsToRoot(Communicator& comm, const at::Tensor& x,
                                            const ShardSpec& spec, int root) {
  if (spec.world_size == 1) return x;
  absl::StatusOr<at::Tensor> all =
      comm.GatherToRoot(RowsFirst(x, spec.axis), spec.sizes(), root, CallKind::kGatherOutput);
  if (!all.ok()) return all.status();
  if (!all->defined()) return at::Tensor();
  return all->movedim(0, spec.axis).contiguous();
}

}  // namespace vaedecode::parallel
