#include "cli/model_loading.h"

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "families/builtin_families.h"

namespace vaedecode::cli {

absl::StatusOr<at::ScalarType> ParseDtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\" (float32, bfloat16 or float16)"));
}

std::string DtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

absl::StatusOr<LoadedModel> LoadModel(const std::optional<std::string>& path, at::ScalarType dtype,
                                      const c10::Device& device) {
  if (!path || path->empty()) {
    absl::Status ok = families::CheckDtypeSupported(dtype, device);
    if (!ok.ok()) return ok;
    LoadedModel m{families::autoencoder_kl::kEmbeddedDefaultName,
                  families::autoencoder_kl::MakeEmbeddedDefault()};
    if (dtype != at::kFloat) m.decoder->ToDtype(dtype);
    return m;
  }
  families::LoadOptions options;
  options.dtype = dtype;
  options.device = device;
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(ResolveUserPath(*path), options);
  if (!decoder.ok()) return decoder.status();
  return LoadedModel{*path, *std::move(decoder)};
}

}  // namespace vaedecode::cli
