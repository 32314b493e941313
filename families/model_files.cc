#include "families/model_files.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status_macros.h"

namespace vaedecode::families {
namespace fs = std::filesystem;
namespace {

constexpr const char* kWeights = "diffusion_pytorch_model.safetensors";
constexpr const char* kIndex = "diffusion_pytorch_model.safetensors.index.json";
constexpr const char* kFp16Weights = "diffusion_pytorch_model.fp16.safetensors";
constexpr const char* kFp16Index = "diffusion_pytorch_model.fp16.safetensors.index.json";
// A whole model's checkpoint, with its VAE under kEmbeddedPrefix.
constexpr const char* kModelWeights = "model.safetensors";
constexpr const char* kModelIndex = "model.safetensors.index.json";
constexpr const char* kEmbeddedPrefix = "vae.";

// The VAE class of a model released as one checkpoint, by its config's
// "architectures" (its "vae" object names no class).
const char* EmbeddedVaeClass(const nlohmann::json& config) {
  static const std::map<std::string, const char*> kClasses = {{"HunyuanImage3ForCausalMM", "AutoencoderKLConv3D"}};
  const auto it = config.find("architectures");
  if (it == config.end() || !it->is_array()) return nullptr;
  for (const nlohmann::json& a : *it) {
    if (!a.is_string()) continue;
    const auto found = kClasses.find(a.get<std::string>());
    if (found != kClasses.end()) return found->second;
  }
  return nullptr;
}

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The folder that holds config.json: `path` itself, or `path`/vae.
absl::StatusOr<fs::path> ResolveVaeDir(const std::string& path) {
  std::error_code ec;
  const fs::path root(path);
  if (!fs::exists(root, ec)) return absl::NotFoundError(absl::StrCat("model path ", path, " does not exist"));
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("model path ", path, " is not a folder"));
  }
  if (IsFile(root / "config.json")) return root;
  if (IsFile(root / "vae" / "config.json")) return root / "vae";
  return absl::NotFoundError(
      absl::StrCat("no config.json in ", path, " or ", (root / "vae").string(), ": expected a diffusers vae/ folder"));
}

absl::StatusOr<std::vector<std::string>> FindWeightFiles(const fs::path& dir) {
  for (const char* index : {kIndex, kFp16Index}) {
    if (IsFile(dir / index)) return formats::ReadShardIndex((dir / index).string());
  }
  for (const char* single : {kWeights, kFp16Weights}) {
    if (IsFile(dir / single)) return std::vector<std::string>{(dir / single).string()};
  }
  if (IsFile(dir / "diffusion_pytorch_model.bin")) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(), " has only a pickled diffusion_pytorch_model.bin; convert it to safetensors"));
  }
  return absl::NotFoundError(absl::StrCat("no ", kWeights, " or ", kIndex, " in ", dir.string()));
}

}  // namespace

ModelFiles::~ModelFiles() = default;

std::string ModelFiles::class_name() const {
  auto it = config_->find("_class_name");
  if (it == config_->end() || !it->is_string()) return "";
  return it->get<std::string>();
}

absl::StatusOr<std::unique_ptr<ModelFiles>> ModelFiles::Open(const std::string& path, Weights needed) {
  ASSIGN_OR_RETURN(fs::path dir, ResolveVaeDir(path));

  std::unique_ptr<ModelFiles> files(new ModelFiles());
  files->vae_dir_ = dir.string();
  files->config_path_ = (dir / "config.json").string();

  std::ifstream in(files->config_path_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", files->config_path_));
  }
  const std::string body = text.str();
  files->config_ = std::make_unique<nlohmann::json>(
      nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false));
  if (files->config_->is_discarded() || !files->config_->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(files->config_path_, ": not a JSON object"));
  }

  // A whole model's release: its "vae" object is the config, `vae.*` its tensors.
  std::string prefix;
  const auto vae = files->config_->find("vae");
  if (!files->config_->contains("_class_name") && vae != files->config_->end() && vae->is_object()) {
    const char* embedded_class = EmbeddedVaeClass(*files->config_);
    if (embedded_class == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(files->config_path_,
                                                     ": a model config with a \"vae\" section, but its "
                                                     "\"architectures\" name no model whose VAE vaedecode knows"));
    }
    nlohmann::json section = *vae;
    if (!section.contains("_class_name")) section["_class_name"] = embedded_class;
    *files->config_ = std::move(section);
    prefix = kEmbeddedPrefix;
  }

  if (needed == Weights::kIgnored) return files;
  std::vector<std::string> weights;
  if (prefix.empty()) {
    ASSIGN_OR_RETURN(weights, FindWeightFiles(dir));
  } else if (IsFile(dir / kModelIndex)) {
    ASSIGN_OR_RETURN(weights, formats::ReadShardIndex((dir / kModelIndex).string(), prefix));
  } else if (IsFile(dir / kModelWeights)) {
    weights = {(dir / kModelWeights).string()};
  } else {
    return absl::NotFoundError(absl::StrCat("no ", kModelIndex, " or ", kModelWeights, " in ", dir.string()));
  }
  files->weight_files_ = weights;

  std::vector<std::string> duplicates;
  for (const std::string& weight_file : files->weight_files_) {
    ASSIGN_OR_RETURN(std::unique_ptr<formats::SafetensorsFile> shard, formats::SafetensorsFile::Open(weight_file));
    for (const formats::TensorView& view : shard->tensors()) {
      if (view.name.compare(0, prefix.size(), prefix) != 0) continue;  // the rest of a whole model
      const std::string name = view.name.substr(prefix.size());
      if (!files->tensors_.emplace(name, &view).second) duplicates.push_back(view.name);
    }
    files->shards_.push_back(std::move(shard));
  }
  if (!duplicates.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensors stored in more than one shard of ", files->vae_dir_, ": ",
                                                   absl::StrJoin(duplicates, ", ")));
  }
  return files;
}

}  // namespace vaedecode::families
