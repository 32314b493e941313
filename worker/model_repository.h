#pragma once

// The models a worker serves: every subfolder of a repository folder that
// holds a diffusers VAE (model name = folder name), or the embedded default
// model (named "default") when no repository is given. Every rank of a group
// loads the same folder in the same (sorted) order, so a model index means
// the same model everywhere.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/encoder.h"

namespace vaedecode::worker {

inline constexpr const char* kDefaultModelName = "default";

struct NamedModel {
  std::string name;
  std::unique_ptr<families::Decoder> decoder;
  // Its folder ("" for the embedded default), for loading its encoder on
  // demand (LoadEncoderFor): decode-only deployments never hold one.
  std::string path;
  // Set: its decoder (and encoder) have seeded weights, not the checkpoint's
  // (benchmarks at real widths from config.json alone).
  std::optional<uint64_t> seeded_weights;
};

// `model`'s encoder from its folder, in its decoder's dtype on its device:
// FAILED_PRECONDITION for the embedded default (it has no folder) and for a
// family or checkpoint without an encoder (Registry::LoadEncoder).
absl::StatusOr<std::unique_ptr<families::Encoder>> LoadEncoderFor(const NamedModel& model);

// A model folder that did not load, and why (the config or weights it
// names; an unreadable folder). Served as unavailable by name, while the
// others are served.
struct UnavailableModel {
  std::string name;
  std::string reason;
};

struct LoadedRepository {
  std::vector<NamedModel> models;
  std::vector<UnavailableModel> unavailable;
  // "name: ..." for models whose config has keys their decoder does not read.
  std::vector<std::string> warnings;
};

// What a loader warns about a model's config: "config keys a, b are not read
// by <class>'s decoder (misspelt, or another class's?); ignored" when some
// are unread, and each structure key that disagrees with the structure.
std::vector<std::string> ConfigWarnings(const families::ModelInfo& info);

// The embedded default model (families/autoencoder_kl/embedded_default.h)
// in DecodeDtype(info, dtype), named `name`.
absl::StatusOr<NamedModel> LoadEmbeddedDefault(at::ScalarType dtype, std::string name = kDefaultModelName);

// `repository` empty → the embedded default only. A folder with no loadable
// model is an error (a worker with nothing to serve is a configuration bug).
// An entry that cannot be read (a symlink loop, a dangling link, no
// permission) is an unavailable model, not an error of the repository.
// Models are loaded on the CPU, each in families::DecodeDtype(info, dtype).
absl::StatusOr<LoadedRepository> LoadRepository(const std::string& repository, at::ScalarType dtype);

}  // namespace vaedecode::worker
