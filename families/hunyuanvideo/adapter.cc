#include "families/hunyuanvideo/adapter.h"

#include "families/row_bands.h"

namespace vaedecode::families::hunyuanvideo {

absl::Status CheckExactSharding(const HunyuanVideoConfig&, const std::vector<int64_t>& latent_shape, int world_size) {
  return CheckRowBands(latent_shape, world_size, 5, kLatentHalo);
}

}  // namespace vaedecode::families::hunyuanvideo
