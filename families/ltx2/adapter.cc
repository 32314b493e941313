#include "families/ltx2/adapter.h"

#include "families/row_bands.h"

namespace vaedecode::families::ltx2 {

absl::Status CheckExactSharding(const LTX2Config&, const std::vector<int64_t>& latent_shape, int world_size) {
  return CheckRowBands(latent_shape, world_size, 5, kLatentHalo);
}

}  // namespace vaedecode::families::ltx2
