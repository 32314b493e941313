#pragma once

// The model-side checks of a tensor a family takes (a decoder's latent, an
// encoder's image), written once: its rank, channels, sizes and dtype.

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"

namespace vaedecode::families {

struct InputRule {
  std::string noun;             // "latent", "image": names the tensor in messages
  std::string diffusers_class;  // the model's class
  std::string verb;             // "expects", "encodes": "<class> <verb> <channels>"
  int64_t channels = 0;
  bool is_video = false;        // [B, C, T, H, W] when true, [B, C, H, W] otherwise
  bool is_audio = false;        // [B, C, L] (an audio VAE's latent)
  bool is_spectrogram = false;  // [B, C, L, M] (a mel spectrogram, or LTX-2 audio's latent)
};

// INVALID_ARGUMENT naming the problem: a rank other than 4 (5 for video, 3 for audio), a
// channel count other than rule.channels, an empty dimension, a
// non-floating dtype.
absl::Status CheckInputTensor(const at::Tensor& t, const InputRule& rule);

}  // namespace vaedecode::families
