#include "families/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/counting_cpu_allocator.h"
#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::families {
std::vector<std::string> Registry::ClassesWithKeysLike(
    const std::map<std::string, const formats::TensorView*>& tensors) const {
  std::vector<std::string> out;
  for (const FamilyRegistration& family : families_) {
    for (const KeySignature& sig : family.signatures) {
      bool match = true;
      for (const auto& [key, rank] : sig.present) {
        auto it = tensors.find(key);
        if (it == tensors.end() || (rank != 0 && it->second->shape.size() != rank)) {
          match = false;
          break;
        }
      }
      for (const std::string& key : sig.absent) match = match && tensors.count(key) == 0;
      if (!match) continue;
      for (const std::string& c : sig.classes) {
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
      }
    }
  }
  return out;
}

void Registry::Register(FamilyRegistration registration) { families_.push_back(std::move(registration)); }

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

namespace {

// What building a model's modules may allocate on the CPU: twice the float32
// size of the weights its config must match (modules are built in float32,
// before the decode dtype), plus room for buffers. A config value the weights
// cannot hold (a block width of a million is a 36 TB convolution; a width of
// 16384 a few GB a layer) then fails as one allocation, by name, instead of
// taking the machine's memory or the process. Seeded decoders (no weights;
// benchmarks and tests at real widths) are not bounded.
constexpr int64_t kBuildSlackBytes = int64_t{256} << 20;

int64_t BuildAllowanceBytes(const ModelFiles& files) {
  int64_t float32_bytes = 0;
  for (const auto& [name, view] : files.tensors()) float32_bytes += view->numel() * 4;
  return 2 * float32_bytes + kBuildSlackBytes;
}

// Runs `factory` with the process's CPU allocations capped at `allowance`
// more bytes than are live now (0: uncapped), turning whatever it throws
// into a Status.
template <typename Built, typename Factory>
absl::StatusOr<std::unique_ptr<Built>> BuildBounded(const Factory& factory, const ModelFiles& files,
                                                    const LoadOptions& options, int64_t allowance) {
  device::CountingCpuAllocator& allocator = device::CountingCpuAllocator::Install();
  const int64_t previous_limit = allocator.limit_bytes();
  if (allowance > 0) {
    const int64_t cap = allocator.current_bytes() + allowance;
    allocator.set_limit_bytes(previous_limit > 0 ? std::min(previous_limit, cap) : cap);
  }
  absl::StatusOr<std::unique_ptr<Built>> built = absl::InternalError("not built");
  const absl::Status caught = CatchExceptions("building the model", [&] { built = factory(files, options); });
  allocator.set_limit_bytes(previous_limit);
  if (caught.ok()) return built;
  if (caught.code() == absl::StatusCode::kResourceExhausted && allowance > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        files.config_path(), ": the config's sizes need more than the ", allowance >> 20,
        " MiB its weights allow while building (a width, channel or layer count too large for the weights?): ",
        caught.message()));
  }
  return absl::InvalidArgumentError(absl::StrCat(files.config_path(), ": ", caught.message()));
}

}  // namespace

absl::StatusOr<std::pair<std::unique_ptr<ModelFiles>, const FamilyRegistration*>> Registry::Open(
    const std::string& path, const LoadOptions& options) const {
  RETURN_IF_ERROR(CheckDtypeSupported(options.dtype));
  ASSIGN_OR_RETURN(
      std::unique_ptr<ModelFiles> files,
      ModelFiles::Open(path, options.seeded_weights ? ModelFiles::Weights::kIgnored : ModelFiles::Weights::kRequired));
  const std::string class_name = files->class_name();
  if (class_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(files->config_path(), " has no \"_class_name\": not a diffusers config"));
  }
  const FamilyRegistration* family = FindByClass(class_name);
  if (family == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(files->config_path(), ": model class ", class_name,
                     " is not supported (supported: ", absl::StrJoin(SupportedClasses(), ", "), ")"));
  }
  return std::make_pair(std::move(files), family);
}

absl::StatusOr<bool> Registry::DecodesAudio(const std::string& path) const {
  LoadOptions config_only;
  config_only.seeded_weights = 0;  // set (any seed): Open skips the weights
  ASSIGN_OR_RETURN(auto opened, Open(path, config_only));
  return opened.second->audio;
}

absl::StatusOr<std::unique_ptr<Encoder>> Registry::LoadEncoder(const std::string& path,
                                                               const LoadOptions& options) const {
  ASSIGN_OR_RETURN(auto opened, Open(path, options));
  const auto& [files, family] = opened;
  if (!family->encoder_factory) {
    return absl::FailedPreconditionError(
        absl::StrCat(files->class_name(), " (", path, ") cannot encode: its family has no encoder yet"));
  }
  if (!options.seeded_weights) {
    bool has_encoder = false;
    for (const auto& [name, view] : files->tensors()) has_encoder = has_encoder || name.rfind("encoder.", 0) == 0;
    if (!has_encoder) {
      return absl::FailedPreconditionError(absl::StrCat(
          files->vae_dir(), " holds no encoder.* weights (a decoder-only checkpoint): it decodes but cannot encode"));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Encoder> encoder,
                   BuildBounded<Encoder>(family->encoder_factory, *files, options,
                                         options.seeded_weights ? 0 : BuildAllowanceBytes(*files)));
  if (options.dtype != encoder->dtype()) encoder->ToDtype(options.dtype);
  return encoder;
}

absl::StatusOr<std::unique_ptr<Decoder>> Registry::Load(const std::string& path, const LoadOptions& options) const {
  ASSIGN_OR_RETURN(auto opened, Open(path, options));
  const auto& [files, family] = opened;
  const std::string class_name = files->class_name();
  absl::StatusOr<std::unique_ptr<Decoder>> decoder =
      BuildBounded<Decoder>(family->factory, *files, options, options.seeded_weights ? 0 : BuildAllowanceBytes(*files));
  if (decoder.ok()) {
    ApplyDecodeDtype(**decoder, options.dtype);
    return decoder;
  }
  if (decoder.status().code() != absl::StatusCode::kInvalidArgument) return decoder;
  const std::vector<std::string> look_like = ClassesWithKeysLike(files->tensors());
  if (look_like.empty() || std::find(look_like.begin(), look_like.end(), class_name) != look_like.end()) {
    return decoder;
  }
  // The likely cause first: the strict-loading list that follows can be long.
  return absl::InvalidArgumentError(absl::StrCat(
      "these weights look like a checkpoint of ", absl::StrJoin(look_like, " or "), ", but ", files->config_path(),
      " says ", class_name, ": the config and the weights come from different models. ", decoder.status().message()));
}

absl::Status FillWeights(torch::nn::Module& module, const ModelFiles& files, const IgnoreRules& ignore,
                         const LoadOptions& options) {
  if (options.seeded_weights) {
    SeedParameters(module, *options.seeded_weights);
    return absl::OkStatus();
  }
  return LoadStrict(module, files.tensors(), ignore, absl::StrCat(files.vae_dir(), " weights"));
}

absl::Status CheckDtypeSupported(at::ScalarType dtype) {
  if (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(dtype), " is not a decoder dtype"));
}

}  // namespace vaedecode::families
