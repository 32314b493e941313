#include "families/hunyuanvideo15/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "families/weight_loading.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::hunyuanvideo15 {
namespace {

HunyuanVideo15Config SmallConfig() {
  absl::StatusOr<HunyuanVideo15Config> c = HunyuanVideo15Config::FromJson({{"latent_channels", 4},
                                                                           {"block_out_channels", {8, 16, 16}},
                                                                           {"layers_per_block", 1},
                                                                           {"spatial_compression_ratio", 4},
                                                                           {"temporal_compression_ratio", 4}},
                                                                          "small");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(HunyuanVideo15Decoder, ParameterNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("hunyuanvideo15"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.")) want.insert(name);
  }
  absl::StatusOr<HunyuanVideo15Config> config = HunyuanVideo15Config::FromJson((*files)->config(), "hunyuanvideo15");
  ASSERT_TRUE(config.ok()) << config.status();
  HunyuanVideo15Decoder decoder(*config, "{}");
  std::set<std::string> have;
  for (const auto& item : decoder.module()->named_parameters()) have.insert(item.key());
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 94u);  // fixtures README; no post-quant conv
}

TEST(HunyuanVideo15Decoder, LoadsTheFixtureAndDescribesIt) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("hunyuanvideo15"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_EQ(info.family, "hunyuanvideo15");
  EXPECT_EQ(info.diffusers_class, "AutoencoderKLHunyuanVideo15");
  EXPECT_EQ(info.latent_channels, 8);
  EXPECT_EQ(info.spatial_factor, 16);
  EXPECT_EQ(info.temporal_factor, 4);
  EXPECT_TRUE(info.is_video);
  EXPECT_EQ(info.peak_latent_frames, 0);
  // diffusers' tiled_decode: 256-pixel tiles, overlap 0.25.
  EXPECT_EQ(info.stock_tile, 16);
  EXPECT_EQ(info.stock_stride, 12);
  EXPECT_EQ((*d)->OutputShape({1, 8, 5, 3, 5}), (std::vector<int64_t>{1, 3, 17, 48, 80}));
  EXPECT_TRUE((*d)->ToVaeSpace(at::full({1, 8, 1, 1, 1}, 1.03682f)).allclose(at::ones({1, 8, 1, 1, 1})));
}

TEST(HunyuanVideo15Decoder, TheFirstFrameUnpacksInSpaceOnlyAndLaterFramesInTime) {
  // With a zero conv the output is the shortcut alone. 8 -> 2 channels with
  // time: repeats 8 · 2 / 8 = 2.
  Upsample up(8, 2, /*upsample_time=*/true);
  {
    at::NoGradGuard no_grad;
    up->conv->conv->weight.zero_();
    up->conv->conv->bias.zero_();
  }
  at::manual_seed(3);
  const at::Tensor x = at::randn({1, 8, 3, 1, 1});
  DenseOps ops;
  const at::Tensor y = up->forward(x, ops);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 2, 5, 2, 2}));  // T -> 2T - 1
  for (int64_t dy = 0; dy < 2; ++dy) {
    for (int64_t dx = 0; dx < 2; ++dx) {
      // Frame 0: unpacked 2x2 to 2 channels, (2·dy + dx)·2 + c -> (c, dy, dx);
      // repeated 2 / 2 = once.
      for (int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(y[0][c][0][dy][dx].item<float>(), x[0][(2 * dy + dx) * 2 + c][0][0][0].item<float>());
      }
      // Latent frames 1 and 2: unpacked 2x2x2 to 1 channel,
      // (dt·2 + dy)·2 + dx -> frame 1 + 2·t + dt, then repeated twice.
      for (int64_t t = 0; t < 2; ++t) {
        for (int64_t dt = 0; dt < 2; ++dt) {
          const float want = x[0][(dt * 2 + dy) * 2 + dx][1 + t][0][0].item<float>();
          for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(y[0][c][1 + 2 * t + dt][dy][dx].item<float>(), want);
        }
      }
    }
  }
}

TEST(HunyuanVideo15Decoder, OneLatentFrameDecodesToOneFrame) {
  HunyuanVideo15Decoder decoder(SmallConfig(), "{}");
  SeedParameters(*decoder.module(), 5);
  at::manual_seed(6);
  DenseOps ops;
  const at::Tensor out = decoder.Decode(at::randn({1, 4, 1, 3, 2}), ops);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 1, 12, 8}));
}

TEST(HunyuanVideo15Decoder, ABatchDecodesAsItsEntriesOneAtATime) {
  // What diffusers computes with enable_slicing (it cannot decode B > 1 at once).
  HunyuanVideo15Decoder decoder(SmallConfig(), "{}");
  SeedParameters(*decoder.module(), 5);
  at::manual_seed(7);
  const at::Tensor z = at::randn({2, 4, 3, 3, 2});
  DenseOps ops;
  const at::Tensor batch = decoder.Decode(z, ops);
  ASSERT_EQ(batch.sizes(), (std::vector<int64_t>{2, 3, 9, 12, 8}));
  for (int64_t i = 0; i < 2; ++i) {
    const at::Tensor one = decoder.Decode(z.narrow(0, i, 1), ops);
    EXPECT_LE((batch.narrow(0, i, 1) - one).abs().max().item<double>(), 1e-5) << "entry " << i;
  }
}

}  // namespace
}  // namespace vaedecode::families::hunyuanvideo15
