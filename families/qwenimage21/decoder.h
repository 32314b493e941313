#pragma once

// The Qwen-Image-2.1 family: diffusers' AutoencoderKLQwenImage21, decoded by
// the Wan blocks (families/wan) with their causal convs folded to 2-D image
// convs (WanConfig::image_convs). Its decode is AutoencoderKLWan's for one
// latent frame (post_quant_conv, the residual up blocks, the clamp to
// [-1, 1]); dense, exactly sharded by rows and tiled as Wan 2.2 is, and
// refused for T > 1 as diffusers refuses it.

#include <memory>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/registry.h"

namespace vaedecode::families::qwenimage21 {

absl::StatusOr<std::unique_ptr<Decoder>> LoadQwenImage21(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::qwenimage21
