#pragma once

// The model used when no --model is given: an SD-1.x-shaped AutoencoderKL
// (widths 128/256/512/512, 2 layers per block, 32 groups, 4 latent channels)
// with weights drawn from a fixed-seed generator of our own, so every build on
// every machine and LibTorch version has bit-identical weights. Random weights:
// it exercises the whole pipeline; it does not draw a picture.

#include <cstdint>
#include <memory>

#include "families/autoencoder_kl/config.h"
#include "families/decoder.h"

namespace vaedecode::families::autoencoder_kl {

inline constexpr const char* kEmbeddedDefaultName = "embedded-sd1-random";

AutoencoderKLConfig EmbeddedDefaultConfig();

// Fills every parameter: conv/linear weights and biases ~ U(-1/√fan_in, 1/√fan_in)
// (LibTorch's default bounds), norm weights 1 and biases 0.
std::unique_ptr<Decoder> MakeSeededAutoencoderKL(const AutoencoderKLConfig& config, uint64_t seed);

std::unique_ptr<Decoder> MakeEmbeddedDefault();

// A small AutoencoderKL with seeded weights (16 and 32 channels, one layer
// per block, 8 groups, 64-pixel stock tiles: 32 latents every 24) that
// decodes in milliseconds: the real decoder for tests of what runs it.
std::unique_ptr<Decoder> MakeSmallSeededAutoencoderKL(double scaling_factor = 0.18215);

}  // namespace vaedecode::families::autoencoder_kl
