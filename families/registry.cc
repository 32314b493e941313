#include "families/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::families {

void Registry::Register(FamilyRegistration registration) {
  families_.push_back(std::move(registration));
}

const FamilyRegistration* Registry::FindByClass(const std::string& diffusers_class) const {
  for (const FamilyRegistration& f : families_) {
    for (const std::string& c : f.diffusers_classes) {
      if (c == diffusers_class) return &f;
    }
  }
  return nullptr;
}

std::vector<std::string> Registry::SupportedClasses() const {
  std::vector<std::string> out;
  for (const FamilyRegistration& f : families_) {
    out.insert(out.end(), f.diffusers_classes.begin(), f.diffusers_classes.end());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Decoder>> Registry::Load(const std::string& path,
                                                        const LoadOptions& options) const {
  absl::Status dtype_ok = CheckDtypeSupported(options.dtype);
  if (!dtype_ok.ok()) return dtype_ok;
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(path);
  if (!files.ok()) return files.status();
  const std::string class_name = (*files)->class_name();
  if (class_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat((*files)->config_path(), " has no \"_class_name\": not a diffusers config"));
  }
  const FamilyRegistration* family = FindByClass(class_name);
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        (*files)->config_path(), ": model class ", class_name, " is not supported (supported: ",
        absl::StrJoin(SupportedClasses(), ", "), ")"));
  }
  return family->factory(**files, options);
}

absl::Status CheckDtypeSupported(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kBFloat16:
      return absl::OkStatus();
    case at::kHalf:
      // CPU conv/group_norm have no fp16 kernels; GPU builds run fp16.
      return absl::InvalidArgumentError(
          "float16 is not supported on the CPU backend; use float32 or bfloat16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", c10::toString(dtype), " is not a decoder dtype"));
  }
}

}  // namespace vaedecode::families
