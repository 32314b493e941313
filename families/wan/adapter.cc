#include "families/wan/adapter.h"

#include "families/row_bands.h"

namespace vaedecode::families::wan {

absl::Status CheckExactSharding(const WanConfig&, const std::vector<int64_t>& latent_shape, int world_size) {
  return CheckRowBands(latent_shape, world_size, 5, kLatentHalo);
}

}  // namespace vaedecode::families::wan
