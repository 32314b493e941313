#pragma once

// Constructor arguments of diffusers' AutoencoderKLFlux2 that shape its decode
// path and its pipeline's latent handling, with diffusers' defaults.
//
// The decoder is AutoencoderKL's (autoencoders/vae.py `Decoder`), built from
// `decoder_block_out_channels` when set and `block_out_channels` otherwise, so
// it is described by an AutoencoderKLConfig. What FLUX.2 adds is pipeline
// side: a BatchNorm2d over the 2x2-patchified latent (running statistics
// only) and the 2x2 patch conversion.

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "families/autoencoder_kl/config.h"

namespace vaedecode::families::flux2 {

struct Flux2Config {
  // The decoder as AutoencoderKL sees it: widths from decoder_block_out_channels
  // (else block_out_channels); scaling_factor 1 and no shift (FLUX.2 has none).
  autoencoder_kl::AutoencoderKLConfig decoder;
  // The encoder as AutoencoderKL sees it: widths from block_out_channels.
  autoencoder_kl::AutoencoderKLConfig encoder;
  double batch_norm_eps = 1e-4;
  // diffusers' `patch_size`; Flux2Pipeline's (un)patchify is fixed at 2x2.
  int64_t patch_h = 2;
  int64_t patch_w = 2;
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;

  int64_t latent_channels() const { return decoder.latent_channels; }
  // Channels of the denoiser-side latent (and of the BatchNorm statistics).
  int64_t patched_channels() const { return decoder.latent_channels * patch_h * patch_w; }

  // The diffusers config.json this configuration corresponds to.
  std::string ToJson() const;

  // Parses and validates (`source` names the file in errors).
  static absl::StatusOr<Flux2Config> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::flux2
