#include "families/autoencoder_kl/embedded_default.h"

#include "families/autoencoder_kl/decoder.h"
#include "families/weight_loading.h"

namespace vaedecode::families::autoencoder_kl {
namespace {

constexpr uint64_t kEmbeddedSeed = 20261129;

}  // namespace

AutoencoderKLConfig EmbeddedDefaultConfig() {
  AutoencoderKLConfig c;
  c.latent_channels = 4;
  c.out_channels = 3;
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.norm_num_groups = 32;
  c.scaling_factor = 0.18215;
  c.sample_size = 512;
  return c;
}

std::unique_ptr<Decoder> MakeSeededAutoencoderKL(const AutoencoderKLConfig& config, uint64_t seed) {
  auto decoder = std::make_unique<AutoencoderKLDecoder>(config, config.ToJson());
  SeedParameters(*decoder->module(), seed);
  return decoder;
}

std::unique_ptr<Decoder> MakeEmbeddedDefault() {
  return MakeSeededAutoencoderKL(EmbeddedDefaultConfig(), kEmbeddedSeed);
}

std::unique_ptr<Decoder> MakeSmallSeededAutoencoderKL(double scaling_factor) {
  AutoencoderKLConfig c;
  c.block_out_channels = {16, 32};
  c.layers_per_block = 1;
  c.norm_num_groups = 8;
  c.sample_size = 64;
  c.scaling_factor = scaling_factor;
  return MakeSeededAutoencoderKL(c, 42);
}

}  // namespace vaedecode::families::autoencoder_kl
