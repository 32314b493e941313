#include "families/autoencoder_kl/adapter.h"

#include "families/row_bands.h"

namespace vaedecode::families::autoencoder_kl {

absl::Status CheckExactSharding(const AutoencoderKLConfig&, const std::vector<int64_t>& latent_shape, int world_size) {
  return CheckRowBands(latent_shape, world_size, 4, kLatentHalo);
}

}  // namespace vaedecode::families::autoencoder_kl
