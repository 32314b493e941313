#include "parallel/band_partition.h"

#include <algorithm>

#include "absl/base/internal/raw_logging.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::parallel {

std::vector<Band> PartitionRows(int64_t rows, int world_size) {
  ABSL_RAW_CHECK(rows >= 0, "PartitionRows: negative row count");
  ABSL_RAW_CHECK(world_size >= 1, "PartitionRows: world_size must be >= 1");
  const int64_t base = rows / world_size;
  const int64_t extra = rows % world_size;
  std::vector<Band> bands(world_size);
  int64_t begin = 0;
  for (int r = 0; r < world_size; ++r) {
    const int64_t size = base + (r < extra ? 1 : 0);
    bands[r] = Band{begin, begin + size};
    begin += size;
  }
  return bands;
}

ShardSpec ShardSpec::ForRows(int axis, int64_t rows, int rank, int world_size) {
  ABSL_RAW_CHECK(rank >= 0 && rank < world_size, "ShardSpec::ForRows: rank out of range");
  ShardSpec spec;
  spec.axis = axis;
  spec.rank = rank;
  spec.world_size = world_size;
  spec.bands = PartitionRows(rows, world_size);
  return spec;
}

ShardSpec ShardSpec::Scaled(int64_t factor) const {
  ABSL_RAW_CHECK(factor >= 1, "ShardSpec::Scaled: factor must be >= 1");
  ShardSpec scaled = *this;
  for (Band& band : scaled.bands) {
    band.begin *= factor;
    band.end *= factor;
  }
  return scaled;
}

std::vector<int64_t> ShardSpec::sizes() const {
  std::vector<int64_t> out;
  out.reserve(bands.size());
  for (const Band& band : bands) out.push_back(band.size());
  return out;
}

int64_t ShardSpec::min_band_rows() const {
  int64_t smallest = bands.empty() ? 0 : bands.front().size();
  for (const Band& band : bands) smallest = std::min(smallest, band.size());
  return smallest;
}

bool ShardSpec::IsValid() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) return false;
  if (static_cast<int>(bands.size()) != world_size) return false;
  int64_t expected_begin = 0;
  for (const Band& band : bands) {
    if (band.begin != expected_begin || band.end < band.begin) return false;
    expected_begin = band.end;
  }
  return true;
}

std::string ShardSpec::DebugString() const {
  return absl::StrCat("ShardSpec{axis=", axis, " rank=", rank, "/", world_size, " bands=[",
                      absl::StrJoin(bands, " ",
                                    [](std::string* out, const Band& band) {
                                      absl::StrAppend(out, "[", band.begin, ",", band.end, ")");
                                    }),
                      "]}");
}

bool operator==(const ShardSpec& a, const ShardSpec& b) {
  return a.axis == b.axis && a.rank == b.rank && a.world_size == b.world_size && a.bands == b.bands;
}

}  // namespace vaedecode::parallel
