#include "families/flux2/adapter.h"

#include "families/autoencoder_kl/adapter.h"

namespace vaedecode::families::flux2 {

absl::Status CheckExactSharding(const Flux2Config& config, const std::vector<int64_t>& latent_shape,
                                int world_size) {
  // The decoder is AutoencoderKL's: the same >= 1-row condition on the
  // VAE-space latent (a packed raw latent is unpacked before it is sharded).
  return autoencoder_kl::CheckExactSharding(config.decoder, latent_shape, world_size);
}

}  // namespace vaedecode::families::flux2
