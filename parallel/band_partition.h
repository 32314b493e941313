#pragma once

// Row-band layout for exact ("VAEP") sharding. Pure arithmetic, no tensors:
// every rank computes the same layout from the same inputs, so band sizes are
// never communicated.

#include <cstdint>
#include <string>
#include <vector>

namespace vaedecode::parallel {

// Half-open row interval [begin, end) of the sharded axis.
struct Band {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  bool operator==(const Band& other) const { return begin == other.begin && end == other.end; }
  bool operator!=(const Band& other) const { return !(*this == other); }
};

// Splits `rows` rows into `world_size` disjoint contiguous bands that cover
// [0, rows) in rank order. Every band has rows / world_size rows and the first
// rows % world_size ranks get one more. When rows < world_size the trailing
// bands are empty; callers decide whether that layout is usable (the exact
// mode falls back to dense when a band is narrower than a layer's halo).
// Requires rows >= 0 and world_size >= 1 (crashes otherwise: a broken
// invariant, not a request error).
std::vector<Band> PartitionRows(int64_t rows, int world_size);

// The sharding state of one tensor, passed explicitly to every sharded
// operator (never global). `bands` describes the current tensor's rows along
// `axis` for every rank, so neighbours' extents are known without asking them.
struct ShardSpec {
  // Tensor dimension the bands split, e.g. 2 for H of [B, C, H, W].
  int axis = 0;
  int rank = 0;
  int world_size = 1;
  // One band per rank, contiguous, in rank order.
  std::vector<Band> bands;

  // The layout of a `rows`-row tensor split by PartitionRows.
  static ShardSpec ForRows(int axis, int64_t rows, int rank, int world_size);

  // The layout after an upsample by `factor` along `axis` (factor >= 1): each
  // band's begin and end scale, so bands stay disjoint and contiguous.
  ShardSpec Scaled(int64_t factor) const;

  const Band& local_band() const { return bands[rank]; }
  const Band& band(int r) const { return bands[r]; }
  int64_t local_rows() const { return local_band().size(); }
  int64_t rows_total() const { return bands.empty() ? 0 : bands.back().end; }
  // Whether this rank holds the global top / bottom edge (where a convolution
  // pads with the layer's own padding instead of neighbour rows).
  bool is_first() const { return rank == 0; }
  bool is_last() const { return rank == world_size - 1; }
  // Band sizes in rank order: the `sizes` argument of an uneven all-gather.
  std::vector<int64_t> sizes() const;
  // The smallest band; exact sharding needs it >= every layer's halo.
  int64_t min_band_rows() const;

  // True when the fields are mutually consistent (world_size >= 1, rank in
  // range, one band per rank, contiguous bands starting at 0).
  bool IsValid() const;
  std::string DebugString() const;
};

bool operator==(const ShardSpec& a, const ShardSpec& b);
inline bool operator!=(const ShardSpec& a, const ShardSpec& b) { return !(a == b); }

}  // namespace vaedecode::parallel
