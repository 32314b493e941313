#include "families/flux2/adapter.h"

#include "families/autoencoder_kl/adapter.h"

namespace vaedecode::families::flux2 {

absl::Status CheckExactSharding(const Flux2Config& config, const std::vector<int64_t>& latent_shape,
                                int world_size) {
  // A raw band of r rows is a VAE band of 2r rows: the raw partition is the
  // binding one, with the same >= 1-row condition.
  return autoencoder_kl::CheckExactSharding(config.decoder, latent_shape, world_size);
}

}  // namespace vaedecode::families::flux2
