#pragma once

// AutoencoderKLQwenImage's constructor arguments, read into the Wan decoder's
// configuration: Qwen-Image's VAE is a Wan 2.1 fork whose blocks were renamed
// (QwenImageCausalConv3d, QwenImageResidualBlock, QwenImageUpBlock, ...) with
// the same structure and state-dict keys. Its config differs in names only:
// `input_channels` is both the image's channel count and the decoder's
// conv_out width; there is no decoder_base_dim, is_residual or patch_size.

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "families/wan/config.h"

namespace vaedecode::families::qwenimage {

// "qwenimage": AutoencoderKLQwenImage, built from WanUpBlock only.
const wan::WanFamily& QwenImageFamilySpec();

absl::StatusOr<wan::WanConfig> QwenImageConfigFromJson(const nlohmann::json& config, const std::string& source);

}  // namespace vaedecode::families::qwenimage
