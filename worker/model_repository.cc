#include "worker/model_repository.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "families/builtin_families.h"
#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

absl::StatusOr<NamedModel> LoadEmbeddedDefault(at::ScalarType dtype, std::string name) {
  RETURN_IF_ERROR(families::CheckDtypeSupported(dtype));
  NamedModel m{std::move(name), families::autoencoder_kl::MakeEmbeddedDefault()};
  families::ApplyDecodeDtype(*m.decoder, dtype);
  return m;
}

absl::StatusOr<std::unique_ptr<families::Encoder>> LoadEncoderFor(const NamedModel& model) {
  if (model.path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model \"", model.name, "\" is the embedded default: it decodes only (serve a folder to encode)"));
  }
  families::LoadOptions options;
  options.dtype = model.decoder->dtype();
  options.seeded_weights = model.seeded_weights;
  ASSIGN_OR_RETURN(std::unique_ptr<families::Encoder> encoder,
                   families::BuiltinFamilies().LoadEncoder(model.path, options));
  RETURN_IF_ERROR(families::CatchExceptions("moving the encoder", [&] { encoder->ToDevice(model.decoder->device()); }));
  return encoder;
}

absl::StatusOr<LoadedRepository> LoadRepository(const std::string& repository, at::ScalarType dtype) {
  LoadedRepository out;
  if (repository.empty()) {
    ASSIGN_OR_RETURN(NamedModel m, LoadEmbeddedDefault(dtype));
    out.models.push_back(std::move(m));
    return out;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(repository, ec)) {
    return absl::NotFoundError(absl::StrCat("model repository ", repository, " is not a folder"));
  }
  // Hidden entries are skipped, as the server's listing skips them
  // (server/model_catalog.h): both sides must agree on the names.
  std::vector<std::string> names;
  for (fs::directory_iterator it(repository, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code entry_ec;
    if (it->is_directory(entry_ec)) {
      names.push_back(name);
    } else if (entry_ec) {
      out.unavailable.push_back({name, absl::StrCat(it->path().string(), ": ", entry_ec.message())});
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("model repository ", repository, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  families::LoadOptions options;
  options.dtype = dtype;
  for (const std::string& name : names) {
    const std::string path = (fs::path(repository) / name).string();
    absl::StatusOr<std::unique_ptr<families::Decoder>> decoder = families::BuiltinFamilies().Load(path, options);
    if (!decoder.ok()) {
      out.unavailable.push_back({name, std::string(decoder.status().message())});
      continue;
    }
    for (const std::string& w : ConfigWarnings((*decoder)->info())) out.warnings.push_back(absl::StrCat(name, ": ", w));
    out.models.push_back({name, *std::move(decoder), path});
  }
  if (out.models.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no loadable model in ", repository,
        out.unavailable.empty() ? ""
                                : absl::StrCat(" (", out.unavailable[0].name, ": ", out.unavailable[0].reason, ")")));
  }
  return out;
}

std::vector<std::string> ConfigWarnings(const families::ModelInfo& info) {
  std::vector<std::string> out;
  if (!info.unread_config_keys.empty()) {
    out.push_back(absl::StrCat("config keys ", absl::StrJoin(info.unread_config_keys, ", "), " are not read by ",
                               info.diffusers_class, "'s decoder (misspelt, or another class's?); ignored"));
  }
  out.insert(out.end(), info.config_warnings.begin(), info.config_warnings.end());
  return out;
}

}  // namespace vaedecode::worker
