#pragma once

// AutoencoderKLQwenImage21's constructor arguments, read into the Wan
// decoder's configuration: Qwen-Image-2.1's VAE is Wan 2.2's structure
// (residual up/down blocks with DupUp3D/AvgDown3D shortcuts, 16x spatial)
// specialised to images: every QwenImage21CausalConv3d is an nn.Conv2d on
// the single frame, so latents and images have T = 1 and its checkpoints
// hold [out, in, kh, kw] conv weights (WanConfig::image_convs). Its
// pipeline de-normalises with latents * latents_std + latents_mean.

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "families/wan/config.h"

namespace vaedecode::families::qwenimage21 {

// "qwenimage21": AutoencoderKLQwenImage21, built from WanResidualUpBlock only.
const wan::WanFamily& QwenImage21FamilySpec();

absl::StatusOr<wan::WanConfig> QwenImage21ConfigFromJson(const nlohmann::json& config, const std::string& source);

}  // namespace vaedecode::families::qwenimage21
