#include "families/autoencoder_kl/embedded_default.h"

#include <cmath>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "families/autoencoder_kl/decoder.h"

namespace vaedecode::families::autoencoder_kl {
namespace {

constexpr uint64_t kEmbeddedSeed = 20261129;

// SplitMix64: tiny, fast, and identical everywhere (unlike LibTorch's RNG,
// whose streams differ between versions and devices).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>((Next() >> 40) * (1.0 / (1ULL << 23)) - 1.0); }

 private:
  uint64_t state_;
};

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
  SplitMix64 rng(seed);
  at::NoGradGuard no_grad;
  // Weights first, then the bias of the same layer, in named_parameters order.
  std::map<std::string, int64_t> fan_in;
  for (const auto& item : decoder->module()->named_parameters()) {
    if (absl::EndsWith(item.key(), ".weight") && item.value().dim() >= 2) {
      const std::string layer = item.key().substr(0, item.key().size() - 7);
      fan_in[layer] = item.value().numel() / item.value().size(0);
    }
  }
  for (auto& item : decoder->module()->named_parameters()) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    const std::string layer = name.substr(0, name.rfind('.'));
    auto it = fan_in.find(layer);
    if (it == fan_in.end()) {  // a norm: identity affine
      p.fill_(absl::EndsWith(name, ".weight") ? 1.0 : 0.0);
      continue;
    }
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(it->second)));
    at::Tensor values = at::empty({p.numel()}, at::kFloat);
    float* data = values.data_ptr<float>();
    for (int64_t i = 0; i < p.numel(); ++i) data[i] = bound * rng.Symmetric();
    p.copy_(values.view(p.sizes()));
  }
  return decoder;
}

std::unique_ptr<Decoder> MakeEmbeddedDefault() {
  return MakeSeededAutoencoderKL(EmbeddedDefaultConfig(), kEmbeddedSeed);
}

}  // namespace vaedecode::families::autoencoder_kl
