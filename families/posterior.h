#pragma once

// diffusers' DiagonalGaussianDistribution over an encoder's moments, and
// the posterior outputs an encode request chooses from.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace vaedecode::families {

enum class PosteriorOutput {
  kMean,     // latent_dist.mean (= .mode()): what edit and I2V pipelines use
  kSample,   // latent_dist.sample(generator): img2img, with a seed
  kMoments,  // mean and log-variance
};

std::string PosteriorOutputName(PosteriorOutput output);

struct Posterior {
  at::Tensor mean;
  at::Tensor logvar;  // clamped to [-30, 20], as diffusers does
};

// moments: [B, 2·C, ...], mean then log-variance along dim 1.
Posterior SplitMoments(const at::Tensor& moments);

// mean + exp(0.5·logvar)·noise with noise drawn as
// torch.randn(mean.shape, generator=torch.Generator().manual_seed(seed))
// (float32, on the CPU, whatever device the posterior is on), so a client
// reproduces diffusers' latent_dist.sample(generator) bit for bit in float32.
at::Tensor SamplePosterior(const Posterior& posterior, uint64_t seed);

// torch.randn(shape, generator=torch.Generator().manual_seed(seed)): float32
// on the CPU, the same numbers on every machine and device. The noise
// SamplePosterior adds, and LTX-2's decode noise.
at::Tensor SeededNoise(at::IntArrayRef shape, uint64_t seed);

}  // namespace vaedecode::families
