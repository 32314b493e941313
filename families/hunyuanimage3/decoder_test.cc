#include "families/hunyuanimage3/decoder.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "formats/safetensors.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::hunyuanimage3 {
namespace {

using ::testing::HasSubstr;

TEST(HunyuanImage3Decoder, ParameterNamesAreTheReleaseDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("hunyuanimage3"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.")) want[name] = view->shape;
  }
  absl::StatusOr<HunyuanImage3Config> config = HunyuanImage3Config::FromJson((*files)->config(), "hunyuanimage3");
  ASSERT_TRUE(config.ok()) << config.status();
  HunyuanImage3Decoder decoder(*config, "{}");
  std::map<std::string, std::vector<int64_t>> have;
  for (const auto& item : decoder.module()->named_parameters()) have[item.key()] = item.value().sizes().vec();
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 60u);
}

TEST(HunyuanImage3Decoder, TakesThePipelinesLatentsAndDescribesThem) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("hunyuanimage3"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "hunyuanimage3");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLConv3D");
  EXPECT_FALSE(info.is_video);
  EXPECT_EQ(info.latent_channels, 16);
  EXPECT_EQ(info.spatial_factor, 4);
  EXPECT_EQ(info.raw_to_vae_formula, "z / scaling_factor");
  EXPECT_EQ(info.stock_tile, 384 / 4);
  EXPECT_THAT(info.decode_note, HasSubstr("makes 2 frames"));
  EXPECT_EQ((*d)->OutputShape({2, 16, 5, 6}), (std::vector<int64_t>{2, 3, 20, 24}));
  EXPECT_TRUE((*d)->ValidateLatent(at::zeros({1, 16, 3, 3})).ok());
  // vae.decode's [B, C, 1, h, w] is not what the pipeline (or this family) takes.
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 16, 1, 3, 3})).message()), HasSubstr("must be 4-D"));
  EXPECT_EQ((*d)->CheckStreaming().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*d)->CheckExactSharding({1, 16, 4, 3}, 4).ok());
}

// The model as Tencent releases it: one root config.json whose "vae" object
// is the VAE's config, and a sharded whole-model checkpoint with the VAE's
// tensors under `vae.`. Only the shards holding them are opened (the other
// one here is not even a safetensors file).
TEST(HunyuanImage3Decoder, LoadsFromTheReleaseFolder) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(std::getenv("TEST_TMPDIR")) / "HunyuanImage-3.0";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string fixture = testing::FixturePath("hunyuanimage3");
  nlohmann::json vae = nlohmann::json::parse(std::ifstream(fixture + "/config.json"));
  vae.erase("_class_name");
  const nlohmann::json config = {{"architectures", {"HunyuanImage3ForCausalMM"}}, {"hidden_size", 4096}, {"vae", vae}};
  std::ofstream(root / "config.json") << config.dump();
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(fixture);
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<formats::TensorView> renamed;
  nlohmann::json weight_map = {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"}};
  for (const auto& [name, view] : (*files)->tensors()) {
    formats::TensorView v = *view;
    v.name = "vae." + name;
    weight_map[v.name] = "model-00002-of-00002.safetensors";
    renamed.push_back(v);
  }
  formats::TensorView other = renamed.front();
  other.name = "model.layers.0.mlp.weight";  // the rest of the model, beside the VAE in one shard
  weight_map[other.name] = "model-00002-of-00002.safetensors";
  renamed.push_back(other);
  ASSERT_TRUE(formats::WriteSafetensors((root / "model-00002-of-00002.safetensors").string(), renamed).ok());
  std::ofstream(root / "model-00001-of-00002.safetensors") << "not opened";
  std::ofstream(root / "model.safetensors.index.json") << nlohmann::json({{"weight_map", weight_map}}).dump();

  absl::StatusOr<std::unique_ptr<Decoder>> released = BuiltinFamilies().Load(root.string(), {});
  ASSERT_TRUE(released.ok()) << released.status();
  absl::StatusOr<std::unique_ptr<Decoder>> plain = BuiltinFamilies().Load(fixture, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*released)->info().diffusers_class, "AutoencoderKLConv3D");
  const at::Tensor latent = at::randn({1, 16, 3, 2}, at::TensorOptions().dtype(at::kFloat));
  DenseOps ops;
  EXPECT_TRUE((*released)->Decode(latent, ops).equal((*plain)->Decode(latent, ops)));
  EXPECT_TRUE(BuiltinFamilies().LoadEncoder(root.string(), {}).ok());

  // A config with a "vae" section of a model vaedecode does not know is refused, naming why.
  std::ofstream(root / "config.json") << nlohmann::json({{"architectures", {"SomeOtherForCausalLM"}}, {"vae", vae}});
  absl::StatusOr<std::unique_ptr<Decoder>> unknown = BuiltinFamilies().Load(root.string(), {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("name no model whose VAE vaedecode knows"));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanimage3
