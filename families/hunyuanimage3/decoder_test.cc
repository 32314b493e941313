#include "families/hunyuanimage3/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
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

}  // namespace
}  // namespace vaedecode::families::hunyuanimage3
