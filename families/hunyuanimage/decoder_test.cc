#include "families/hunyuanimage/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "families/nn/modules.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::hunyuanimage {
namespace {

TEST(HunyuanImageDecoder, ParameterNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("hunyuanimage21"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.")) want.insert(name);
  }
  absl::StatusOr<HunyuanImageConfig> config = HunyuanImageConfig::FromJson((*files)->config(), "hunyuanimage21");
  ASSERT_TRUE(config.ok()) << config.status();
  HunyuanImageDecoder decoder(*config, "{}");
  std::set<std::string> have;
  for (const auto& item : decoder.module()->named_parameters()) have.insert(item.key());
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 138u);  // fixtures README; no post-quant conv
}

TEST(HunyuanImageDecoder, LoadsTheFixtureAndDescribesIt) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("hunyuanimage21"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "hunyuanimage");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLHunyuanImage");
  EXPECT_EQ(info.latent_channels, 16);
  EXPECT_EQ(info.spatial_factor, 32);
  EXPECT_FALSE(info.is_video);
  EXPECT_EQ(info.parameter_count, 953187);  // meta.json num_decoder_params
  // diffusers' tiled_decode at sample_size 384: 12-latent tiles every 9.
  EXPECT_EQ(info.stock_tile, 12);
  EXPECT_EQ(info.stock_stride, 9);
  EXPECT_EQ((*d)->OutputShape({2, 16, 7, 5}), (std::vector<int64_t>{2, 3, 224, 160}));
  EXPECT_TRUE((*d)->ToVaeSpace(at::full({1, 16, 1, 1}, 0.75289f)).allclose(at::ones({1, 16, 1, 1})));
  EXPECT_TRUE((*d)->CheckExactSharding({1, 16, 7, 5}, 4).ok());
  EXPECT_FALSE((*d)->CheckExactSharding({1, 16, 3, 5}, 4).ok());
}

TEST(HunyuanImageDecoder, TheUpsamplerShufflesSubPixelMajor) {
  // Input channel (2·dy + dx)·C + c lands on pixel (c, 2y + dy, 2x + dx).
  const int64_t c = 3;
  const at::Tensor x = at::arange(4 * c * 2 * 2, at::kFloat).view({1, 4 * c, 2, 2});
  const at::Tensor y = nn::SubpixelMajorDepthToSpace(x, 1, 2, 2);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, c, 4, 4}));
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t py = 0; py < 4; ++py) {
      for (int64_t px = 0; px < 4; ++px) {
        const int64_t in_ch = (2 * (py % 2) + px % 2) * c + ch;
        EXPECT_EQ(y[0][ch][py][px].item<float>(), x[0][in_ch][py / 2][px / 2].item<float>());
      }
    }
  }
}

TEST(HunyuanImageDecoder, TheUpsamplerShortcutRepeatsChannelsBeforeShuffling) {
  // With a zero conv the output is the shortcut alone: channel c of the
  // input repeated `repeats` times (repeat_interleave), then shuffled.
  Upsample up(2, 1);  // 4·1 / 2: each input channel twice
  {
    at::NoGradGuard no_grad;
    up->conv->weight.zero_();
    up->conv->bias.zero_();
  }
  const at::Tensor x = at::tensor({1.0f, 2.0f}).view({1, 2, 1, 1});
  DenseOps ops;
  const at::Tensor y = up->forward(x, ops);
  // Channels after repeat: [1, 1, 2, 2] -> (dy, dx) = (0,0), (0,1), (1,0), (1,1).
  EXPECT_TRUE(y.equal(at::tensor({1.0f, 1.0f, 2.0f, 2.0f}).view({1, 1, 2, 2})));
}

}  // namespace
}  // namespace vaedecode::families::hunyuanimage
