#include "families/hunyuanvideo/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "families/hunyuanvideo/blocks.h"
#include "families/model_files.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::hunyuanvideo {
namespace {

HunyuanVideoConfig SmallConfig() {
  HunyuanVideoConfig c;
  c.latent_channels = 4;
  c.block_out_channels = {4, 8, 8};
  c.layers_per_block = 1;
  c.norm_num_groups = 2;
  c.spatial_compression_ratio = 4;  // blocks 0 and 1 upsample in space and time, block 2 not at all
  return c;
}

void Randomise(torch::nn::Module& m, uint64_t seed) {
  at::manual_seed(seed);
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes()) * 0.3);
}

TEST(HunyuanVideoDecoder, ParameterNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("hunyuanvideo"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.")) want.insert(name);
  }
  absl::StatusOr<HunyuanVideoConfig> config = HunyuanVideoConfig::FromJson((*files)->config(), "hunyuanvideo");
  ASSERT_TRUE(config.ok()) << config.status();
  HunyuanVideoDecoder decoder(*config, "{}");
  std::set<std::string> have;
  for (const auto& item : decoder.module()->named_parameters()) have.insert(item.key());
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 140u);  // 138 decoder.* + 2 post_quant_conv.* (fixtures README)
}

TEST(HunyuanVideoDecoder, LoadsTheFixtureAndDescribesIt) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("hunyuanvideo"));
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::unique_ptr<Decoder>> d = LoadHunyuanVideo(**files, {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "hunyuanvideo");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLHunyuanVideo");
  EXPECT_EQ(info.spatial_factor, 8);
  EXPECT_EQ(info.temporal_factor, 4);
  EXPECT_EQ(info.stock_tile, 32);  // diffusers' 256-pixel tiles every 192 pixels
  EXPECT_EQ(info.stock_stride, 24);
  EXPECT_TRUE(info.is_video);
  EXPECT_EQ((*d)->OutputShape({1, 16, 4, 5, 7}), (std::vector<int64_t>{1, 3, 13, 40, 56}));
  EXPECT_TRUE((*d)->ToVaeSpace(at::full({1, 16, 1, 1, 1}, 0.476986f)).allclose(at::ones({1, 16, 1, 1, 1})));
}

TEST(HunyuanVideoDecoder, TheFirstFrameUpsamplesInSpaceOnly) {
  HunyuanVideoUpsampleCausal3D up(1, /*upsample_time=*/true, /*upsample_space=*/true);
  {
    at::NoGradGuard no_grad;
    up->conv->conv->weight.zero_();
    up->conv->conv->weight[0][0][2][1][1] = 1.0f;  // the current frame's centre tap
    up->conv->conv->bias.zero_();
  }
  const at::Tensor x = at::arange(3, at::kFloat).view({1, 1, 3, 1, 1}).expand({1, 1, 3, 2, 2}).contiguous();
  DenseOps ops;
  const at::Tensor y = up->forward(x, ops);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 1, 5, 4, 4}));
  EXPECT_TRUE(y.select(3, 0).select(3, 0).flatten().equal(at::tensor({0.0f, 1.0f, 1.0f, 2.0f, 2.0f})));
}

TEST(HunyuanVideoDecoder, LongLatentsDecodeInBlendedTemporalTiles) {
  HunyuanVideoDecoder decoder(SmallConfig(), "{}");
  Randomise(*decoder.module(), 3);
  at::manual_seed(4);
  const at::Tensor z = at::randn({1, 4, 7, 3, 2});
  DenseOps ops;
  const at::Tensor out = decoder.Decode(z, ops);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 25, 12, 8}));
  EXPECT_EQ(decoder.OutputShape(z.sizes().vec()), out.sizes().vec());
  // Windows: latent frames [0, 5) -> 17 frames, [3, 7) -> 13 - 1, [6, 7) -> 1 - 1.
  at::NoGradGuard no_grad;
  const at::Tensor first = decoder.module()->DecodeWhole(z.narrow(2, 0, 5), ops);
  const at::Tensor second = decoder.module()->DecodeWhole(z.narrow(2, 3, 4), ops).narrow(2, 1, 12);
  // Frames 0..12 are the first window's.
  EXPECT_TRUE(out.narrow(2, 0, 13).equal(first.narrow(2, 0, 13)));
  // Frames 13..16: the second window's first 4 frames blended with the first
  // window's last 4, weights x/4.
  for (int64_t x = 0; x < 4; ++x) {
    const double w = x / 4.0;
    const at::Tensor want = first.select(2, 13 + x) * (1 - w) + second.select(2, x) * w;
    EXPECT_TRUE(at::allclose(out.select(2, 13 + x), want, 0, 1e-6)) << "frame " << 13 + x;
  }
  // Frames 17..24: the second window's, unblended.
  EXPECT_TRUE(out.narrow(2, 17, 8).equal(second.narrow(2, 4, 8)));
}

TEST(HunyuanVideoDecoder, UpToFourLatentFramesDecodeWhole) {
  HunyuanVideoDecoder decoder(SmallConfig(), "{}");
  Randomise(*decoder.module(), 3);
  at::manual_seed(5);
  const at::Tensor z = at::randn({2, 4, 4, 3, 2});
  DenseOps ops;
  const at::Tensor out = decoder.Decode(z, ops);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 13, 12, 8}));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(out.equal(decoder.module()->DecodeWhole(z, ops)));
}

TEST(HunyuanVideoDecoder, OneRowPerBandIsEnough) {
  const HunyuanVideoDecoder d(SmallConfig(), "{}");
  EXPECT_TRUE(d.CheckExactSharding({1, 4, 3, 2, 3}, 2).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 4, 3, 2, 3}, 3).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 4, 3, 5, 3}, 1).ok());
}

}  // namespace
}  // namespace vaedecode::families::hunyuanvideo
