#pragma once

// A diffusers VAE as it is on disk: `config.json` plus
// `diffusion_pytorch_model.safetensors` (or a sharded `*.safetensors.index.json`),
// in a `vae/` folder or a model root that holds one. Or a model released as
// one checkpoint with its VAE inside (Hunyuan Image 3: a root config.json
// whose "vae" object is the VAE's config, and `vae.*` tensors in
// model.safetensors or the shards model.safetensors.index.json names): the
// config is that object, the tensors those without the prefix, and only the
// shards holding them are opened. Weights stay memory-mapped; tensors()
// views point into the mappings and live as long as this object.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "formats/safetensors.h"

namespace vaedecode::families {

class ModelFiles {
 public:
  enum class Weights {
    kRequired,  // config.json and the weights
    kIgnored,   // config.json alone; tensors() is empty (seeded decoders)
  };
  // `path`: a folder with config.json and weights, or a model root with vae/.
  static absl::StatusOr<std::unique_ptr<ModelFiles>> Open(const std::string& path,
                                                          Weights weights = Weights::kRequired);
  ~ModelFiles();

  const std::string& vae_dir() const { return vae_dir_; }
  const std::string& config_path() const { return config_path_; }
  const nlohmann::json& config() const { return *config_; }
  // "_class_name" of the config, or "" when absent.
  std::string class_name() const;
  // Every tensor of every shard, by name.
  const std::map<std::string, const formats::TensorView*>& tensors() const { return tensors_; }
  const std::vector<std::string>& weight_files() const { return weight_files_; }

 private:
  ModelFiles() = default;

  std::string vae_dir_;
  std::string config_path_;
  std::unique_ptr<nlohmann::json> config_;
  std::vector<std::string> weight_files_;
  std::vector<std::unique_ptr<formats::SafetensorsFile>> shards_;
  std::map<std::string, const formats::TensorView*> tensors_;
};

}  // namespace vaedecode::families
