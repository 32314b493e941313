#pragma once

// Model and dtype selection shared by the CLI's commands and its rank workers.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "worker/model_repository.h"

namespace vaedecode::cli {

// The model at `path` (named by the path given, or the embedded default's
// name) (relative to the caller's directory), or the embedded
// default when `path` is empty, loaded on the CPU in DecodeDtype(info,
// dtype). `seeded_weights`: the folder's config.json alone, with parameters
// seeded from it (families::LoadOptions).
absl::StatusOr<worker::NamedModel> LoadModel(const std::optional<std::string>& path, at::ScalarType dtype,
                                             std::optional<uint64_t> seeded_weights = std::nullopt);

}  // namespace vaedecode::cli
