#include "cli/model_loading.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "families/builtin_families.h"
#include "rpc/status_macros.h"

namespace vaedecode::cli {

absl::StatusOr<worker::NamedModel> LoadModel(const std::optional<std::string>& path, at::ScalarType dtype,
                                             std::optional<uint64_t> seeded_weights) {
  if (!path || path->empty()) return worker::LoadEmbeddedDefault(dtype, families::autoencoder_kl::kEmbeddedDefaultName);
  families::LoadOptions options;
  options.dtype = dtype;
  options.seeded_weights = seeded_weights;
  const std::string folder = ResolveUserPath(*path);
  ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, families::BuiltinFamilies().Load(folder, options));
  for (const std::string& w : worker::ConfigWarnings(decoder->info())) {
    std::cerr << "warning: " << *path << ": " << w << "\n";
  }
  return worker::NamedModel{*path, std::move(decoder), folder, seeded_weights};
}

}  // namespace vaedecode::cli
