#pragma once

// The Qwen-Image family: diffusers' AutoencoderKLQwenImage, decoded by the
// Wan blocks (families/wan). The family accepts only Wan 2.1's up block
// (QwenImageUpBlock is WanUpBlock renamed); its decode is AutoencoderKLWan's
// without an unpatchify, ending in the same clamp to [-1, 1].

#include <memory>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/registry.h"
#include "families/wan/decoder.h"

namespace vaedecode::families::qwenimage {

absl::StatusOr<std::unique_ptr<Decoder>> LoadQwenImage(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::qwenimage
