#pragma once

// Qwen-Image's encode side: AutoencoderKLQwenImage's `_encode` is
// AutoencoderKLWan's without a patchify, run by the Wan blocks
// (families/wan/encoder.h) under Qwen-Image's config.

#include <memory>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::qwenimage {

absl::StatusOr<std::unique_ptr<Encoder>> LoadQwenImageEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::qwenimage
