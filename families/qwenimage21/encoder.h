#pragma once

// Qwen-Image-2.1's encode side: AutoencoderKLQwenImage21's `_encode` of one
// image (T = 1), run by the Wan blocks (families/wan/encoder.h) with 2-D
// convs under Qwen-Image-2.1's config.

#include <memory>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::qwenimage21 {

absl::StatusOr<std::unique_ptr<Encoder>> LoadQwenImage21Encoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::qwenimage21
