#include "families/model_files.h"

#include <filesystem>
#include <fstream>
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

  if (needed == Weights::kIgnored) return files;
  ASSIGN_OR_RETURN(std::vector<std::string> weights, FindWeightFiles(dir));
  files->weight_files_ = weights;

  std::vector<std::string> duplicates;
  for (const std::string& weight_file : files->weight_files_) {
    ASSIGN_OR_RETURN(std::unique_ptr<formats::SafetensorsFile> shard, formats::SafetensorsFile::Open(weight_file));
    for (const formats::TensorView& view : shard->tensors()) {
      if (!files->tensors_.emplace(view.name, &view).second) duplicates.push_back(view.name);
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
