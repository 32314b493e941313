#include "families/model_files.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::path(std::getenv("TEST_TMPDIR")) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void WriteText(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(ModelFiles, OpensAVaeFolder) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(testing::FixturePath("sd_kl"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->class_name(), "AutoencoderKL");
  EXPECT_EQ((*f)->tensors().size(), 152u);
  EXPECT_EQ((*f)->weight_files().size(), 1u);
}

TEST(ModelFiles, OpensAModelRootHoldingVae) {
  fs::path root = TempDir("root");
  fs::create_directory_symlink(testing::FixturePath("flux1_kl"), root / "vae");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(root.string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->vae_dir(), (root / "vae").string());
}

TEST(ModelFiles, ReadsShardedCheckpointsThroughTheIndex) {
  // Two shards: the fixture file itself and an extra one with the I64 counter.
  fs::path dir = TempDir("sharded");
  fs::copy_file(testing::FixturePath("sd_kl/config.json"), dir / "config.json");
  fs::copy_file(testing::FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                dir / "diffusion_pytorch_model-00001-of-00002.safetensors");
  fs::copy_file(testing::FixturePath("flux2_kl/diffusion_pytorch_model.safetensors"),
                dir / "diffusion_pytorch_model-00002-of-00002.safetensors");
  WriteText(dir / "diffusion_pytorch_model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {
                 "decoder.conv_in.weight": "diffusion_pytorch_model-00001-of-00002.safetensors",
                 "bn.num_batches_tracked": "diffusion_pytorch_model-00002-of-00002.safetensors"}})");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  // Both shards hold decoder.conv_in.weight etc.: refused, naming the keys.
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("more than one shard"));

  fs::remove(dir / "diffusion_pytorch_model-00002-of-00002.safetensors");
  fs::copy_file(testing::FixturePath("sd_kl/latent.safetensors"),
                dir / "diffusion_pytorch_model-00002-of-00002.safetensors");
  f = ModelFiles::Open(dir.string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->weight_files().size(), 2u);
  EXPECT_EQ((*f)->tensors().size(), 153u);  // 152 weights + the "latent" of shard 2
}

TEST(ModelFiles, MissingConfigIsNotFound) {
  fs::path dir = TempDir("empty");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("no config.json"));
}

TEST(ModelFiles, MalformedConfigIsInvalid) {
  fs::path dir = TempDir("badjson");
  WriteText(dir / "config.json", "{ not json");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("not a JSON object"));
}

TEST(ModelFiles, PickleCheckpointsAreRefusedWithAHint) {
  fs::path dir = TempDir("pickle");
  WriteText(dir / "config.json", R"({"_class_name": "AutoencoderKL"})");
  WriteText(dir / "diffusion_pytorch_model.bin", "pickle");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("convert it to safetensors"));
}

TEST(ModelFiles, MissingWeightsAreNotFound) {
  fs::path dir = TempDir("noweights");
  WriteText(dir / "config.json", R"({"_class_name": "AutoencoderKL"})");
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelFiles, TruncatedWeightsAreInvalid) {
  fs::path dir = TempDir("truncated");
  fs::copy_file(testing::FixturePath("sd_kl/config.json"), dir / "config.json");
  fs::copy_file(testing::FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                dir / "diffusion_pytorch_model.safetensors");
  fs::resize_file(dir / "diffusion_pytorch_model.safetensors", 5000);
  absl::StatusOr<std::unique_ptr<ModelFiles>> f = ModelFiles::Open(dir.string());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
}

}  // namespace
}  // namespace vaedecode::families
