#include "families/wan/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "families/nn/modules.h"
#include "families/wan/blocks.h"
#include "families/wan/encoder.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::wan {
namespace {

using ::testing::HasSubstr;

// Two levels: one up block that doubles time and space, then the last.
WanConfig SmallConfig() {
  WanConfig c;
  c.base_dim = 4;
  c.z_dim = 4;
  c.dim_mult = {1, 2};
  c.num_res_blocks = 1;
  c.temperal_downsample = {true};
  c.latents_mean = {0.5, -1.0, 2.0, 0.0};
  c.latents_std = {2.0, 0.5, 1.0, 4.0};
  return c;
}

WanConfig SmallResidualConfig() {
  WanConfig c = SmallConfig();
  c.is_residual = true;
  c.out_channels = 12;
  c.patch_size = 2;
  return c;
}

std::unique_ptr<WanDecoder> Make(const WanConfig& c) {
  absl::StatusOr<std::unique_ptr<WanDecoder>> d = WanDecoder::Create(WanFamilySpec(), c, "{}");
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// Parameter names and shapes of the model vs the fixture's decode-side keys.
class WanParameterNames : public ::testing::TestWithParam<std::tuple<std::string, size_t>> {};

TEST_P(WanParameterNames, AreTheDiffusersDecodeKeys) {
  const auto& [fixture, count] = GetParam();
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath(fixture));
  ASSERT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.")) {
      want[name] = view->shape;
    }
  }
  absl::StatusOr<std::unique_ptr<Decoder>> loaded = BuiltinFamilies().Load(testing::FixturePath(fixture), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto* decoder = dynamic_cast<WanDecoder*>(loaded->get());
  ASSERT_NE(decoder, nullptr);
  std::map<std::string, std::vector<int64_t>> have;
  for (const auto& item : decoder->module().named_parameters()) have[item.key()] = item.value().sizes().vec();
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), count);
  EXPECT_TRUE(decoder->module().named_buffers().is_empty());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WanParameterNames,
                         // decoder.* + 2 post_quant_conv.* (fixtures README)
                         ::testing::Values(std::make_tuple("wan21", 108u), std::make_tuple("wan22", 110u),
                                           std::make_tuple("qwenimage", 108u), std::make_tuple("qwenimage21", 132u)),
                         [](const auto& info) { return std::get<0>(info.param); });

TEST(WanDecoder, ModelInfoFollowsTheFixtureConfigs) {
  absl::StatusOr<std::unique_ptr<Decoder>> wan22 = BuiltinFamilies().Load(testing::FixturePath("wan22"), {});
  ASSERT_TRUE(wan22.ok()) << wan22.status();
  const ModelInfo& w = (*wan22)->info();
  EXPECT_EQ(w.family, "wan");
  EXPECT_EQ(w.diffusers_class, "AutoencoderKLWan");
  EXPECT_TRUE(w.is_video);
  EXPECT_EQ(w.latent_channels, 48);
  EXPECT_EQ(w.out_channels, 3);
  EXPECT_EQ(w.spatial_factor, 16);
  EXPECT_EQ(w.temporal_factor, 4);
  EXPECT_EQ((*wan22)->OutputShape({1, 48, 2, 5, 7}), (std::vector<int64_t>{1, 3, 5, 80, 112}));

  absl::StatusOr<std::unique_ptr<Decoder>> qwen = BuiltinFamilies().Load(testing::FixturePath("qwenimage"), {});
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  const ModelInfo& q = (*qwen)->info();
  EXPECT_EQ(q.family, "qwenimage");
  EXPECT_EQ(q.diffusers_class, "AutoencoderKLQwenImage");
  EXPECT_EQ(q.out_channels, 4);
  EXPECT_EQ(q.spatial_factor, 8);
  EXPECT_EQ((*qwen)->OutputShape({2, 16, 1, 13, 10}), (std::vector<int64_t>{2, 4, 1, 104, 80}));
}

TEST(WanDecoder, AFamilyRefusesUpBlocksItDoesNotName) {
  const WanFamily image_only{"test", "AutoencoderKLTest", {UpBlockType::kUpBlock}};
  absl::StatusOr<std::unique_ptr<WanDecoder>> d = WanDecoder::Create(image_only, SmallResidualConfig(), "{}");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("AutoencoderKLTest config needs WanResidualUpBlock blocks; "
                                                           "this family is built from WanUpBlock"));
}

TEST(WanDecoder, RawSpaceDividesByTheInverseStdAndAddsTheMean) {
  std::unique_ptr<WanDecoder> d = Make(SmallConfig());
  at::Tensor z = d->ToVaeSpace(at::ones({1, 4, 1, 1, 1}));
  EXPECT_TRUE(z.flatten().equal(at::tensor({2.5f, -0.5f, 3.0f, 4.0f})));
}

TEST(WanDecoder, FramesAndShapesFollowTheCausalProtocol) {
  for (const WanConfig& c : {SmallConfig(), SmallResidualConfig()}) {
    std::unique_ptr<WanDecoder> d = Make(c);
    DenseOps ops;
    at::manual_seed(1);
    const at::Tensor z = at::randn({2, 4, 3, 3, 2});
    const at::Tensor x = d->Decode(z, ops);
    // First latent frame -> 1 frame, each later one -> temporal_factor (2).
    const int64_t s = c.spatial_factor();
    EXPECT_EQ(x.sizes(), (std::vector<int64_t>{2, 3, 5, 3 * s, 2 * s}));
    EXPECT_EQ(d->OutputShape(z.sizes().vec()), x.sizes().vec());
    EXPECT_LE(x.abs().max().item<float>(), 1.0f);  // clamped
    // Causal: the frames of a prefix of the latent do not see later frames.
    const at::Tensor prefix = d->Decode(z.narrow(2, 0, 2).contiguous(), ops);
    EXPECT_TRUE(prefix.equal(x.narrow(2, 0, 3)));
    // A lone first frame runs some per-frame ops at other shapes, where
    // LibTorch may pick other kernels: equal up to rounding (a later
    // frame leaking in would move it by O(0.1)).
    const at::Tensor first = d->Decode(z.narrow(2, 0, 1).contiguous(), ops);
    EXPECT_LE((first - x.narrow(2, 0, 1)).abs().max().item<double>(), 1e-5);
  }
}

TEST(WanDecoder, RepeatDecodesStartWithAnEmptyCache) {
  std::unique_ptr<WanDecoder> d = Make(SmallConfig());
  DenseOps ops;
  at::manual_seed(2);
  const at::Tensor a = at::randn({1, 4, 3, 2, 3});
  const at::Tensor b = at::randn({1, 4, 2, 2, 3});
  const at::Tensor b1 = d->Decode(b, ops);
  d->Decode(a, ops);  // a longer video in between leaves nothing behind
  const at::Tensor b2 = d->Decode(b, ops);
  EXPECT_TRUE(b1.equal(b2));
}

// A session's chunks, concatenated, are the whole clip's decode bit for bit,
// however the clip is split; the cache is the state between chunks.
TEST(WanDecoder, StreamedChunksEqualTheWholeClip) {
  for (const WanConfig& c : {SmallConfig(), SmallResidualConfig()}) {
    std::unique_ptr<WanDecoder> d = Make(c);
    ASSERT_TRUE(d->CheckStreaming().ok());
    DenseOps ops;
    at::manual_seed(3);
    const at::Tensor z = at::randn({2, 4, 4, 3, 2});
    const at::Tensor whole = d->Decode(z, ops);
    for (const std::vector<int64_t>& split : std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {2, 2}, {1, 3}, {3, 1}}) {
      std::unique_ptr<DecodeStream> stream = d->OpenStream();
      ASSERT_NE(stream, nullptr);
      EXPECT_EQ(stream->state_bytes(), 0);
      std::vector<at::Tensor> frames;
      int64_t begin = 0;
      for (int64_t t : split) {
        frames.push_back(stream->DecodeChunk(z.narrow(2, begin, t).contiguous(), ops));
        begin += t;
        EXPECT_EQ(stream->latent_frames(), begin);
        EXPECT_GT(stream->state_bytes(), 0);
      }
      EXPECT_TRUE(at::cat(frames, 2).equal(whole)) << "split of " << split.size() << " chunks";
    }
  }
}

// Counts the row-coupled ops and remembers every weight they were given.
class RecordingOps final : public LayerOps {
 public:
  at::Tensor Conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const ConvGeometry& g) override {
    if (g.padding_h > 0) ++halo_convs;
    EXPECT_EQ(g.padding_t, 0) << "temporal padding belongs to the block";
    weights.insert(w.data_ptr());
    weights.insert(b.data_ptr());
    return dense_.Conv(x, w, b, g);
  }
  at::Tensor GroupNorm(const at::Tensor& x, int64_t groups, const at::Tensor& w, const at::Tensor& b,
                       double eps) override {
    ++group_norms;
    return dense_.GroupNorm(x, groups, w, b, eps);
  }
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override {
    ++attentions;
    EXPECT_EQ(layout.kind, TokenLayout::Kind::kFull);
    EXPECT_EQ(q.size(-2) % layout.tokens_per_row, 0);
    return dense_.Attention(q, k, v, layout);
  }

  int halo_convs = 0, group_norms = 0, attentions = 0;
  std::set<void*> weights;

 private:
  DenseOps dense_;
};

TEST(WanDecoder, RowCoupledOpsRunOnTheModulesOwnParameters) {
  std::unique_ptr<WanDecoder> d = Make(SmallConfig());
  RecordingOps ops;
  d->Decode(at::randn({1, 4, 3, 2, 2}), ops);
  // Per latent frame: conv_in, 2x2 mid-block convs, 2 up blocks x 2 resnets
  // x 2 convs, 1 upsampler conv, conv_out = 15 halo convs; 1 attention.
  EXPECT_EQ(ops.halo_convs, 3 * 15);
  EXPECT_EQ(ops.attentions, 3);
  EXPECT_EQ(ops.group_norms, 0);
  std::set<void*> params;
  for (const at::Tensor& p : d->module().parameters()) params.insert(p.data_ptr());
  for (void* w : ops.weights) EXPECT_TRUE(params.count(w)) << "a conv got a copy of its weights";
}

TEST(WanDecoder, UnpatchifyTakesTheWidthOffsetAsTheSlowerIndex) {
  // Output pixel (c, y·P + dy, x·P + dx) comes from channel c·P·P + dx·P + dy.
  const at::Tensor x = at::arange(2 * 4, at::kFloat).view({1, 8, 1, 1, 1});  // C=2, P=2
  const at::Tensor y = nn::Unpatchify(x, 2);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, 2, 1, 2, 2}));
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t dy = 0; dy < 2; ++dy) {
      for (int64_t dx = 0; dx < 2; ++dx) {
        EXPECT_EQ(y[0][c][0][dy][dx].item<float>(), static_cast<float>(c * 4 + dx * 2 + dy));
      }
    }
  }
}

TEST(WanDecoder, ValidatesFiveDimensionalLatents) {
  std::unique_ptr<WanDecoder> d = Make(SmallConfig());
  EXPECT_THAT(std::string(d->ValidateLatent(at::zeros({1, 4, 3, 3})).message()), HasSubstr("must be 5-D"));
  EXPECT_THAT(std::string(d->ValidateLatent(at::zeros({1, 3, 1, 3, 3})).message()),
              HasSubstr("latent has 3 channels; AutoencoderKLWan expects 4"));
  EXPECT_TRUE(d->ValidateLatent(at::zeros({1, 4, 1, 3, 3})).ok());
}

TEST(WanDecoder, QwenImage21IsAnImageModelWithTwoDimensionalConvs) {
  absl::StatusOr<std::unique_ptr<Decoder>> loaded = BuiltinFamilies().Load(testing::FixturePath("qwenimage21"), {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto* d = dynamic_cast<WanDecoder*>(loaded->get());
  ASSERT_NE(d, nullptr);
  const ModelInfo& info = d->info();
  EXPECT_EQ(info.family, "qwenimage21");
  EXPECT_EQ(info.out_channels, 4);
  EXPECT_EQ(info.spatial_factor, 16);
  EXPECT_EQ(info.temporal_factor, 1);
  EXPECT_EQ(info.raw_to_vae_formula, "z * latents_std + latents_mean");
  // diffusers' 256-pixel tiles every 192 pixels, at 16x.
  EXPECT_EQ(info.stock_tile, 16);
  EXPECT_EQ(info.stock_stride, 12);
  EXPECT_EQ(d->module().named_parameters()["decoder.conv_in.weight"].dim(), 4);
  EXPECT_TRUE(d->ValidateLatent(at::zeros({1, 64, 1, 3, 3})).ok());
  EXPECT_THAT(std::string(d->ValidateLatent(at::zeros({1, 64, 2, 3, 3})).message()),
              HasSubstr("a latent of 2 frames cannot be decoded by AutoencoderKLQwenImage21"));
  const absl::Status streams = d->CheckStreaming();
  EXPECT_EQ(streams.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->OpenStream(), nullptr);
  // raw: its pipeline's latents * std + mean (not Wan's / (1 / std)).
  const at::Tensor raw = at::ones({1, 64, 1, 1, 1});
  const at::Tensor vae = d->ToVaeSpace(raw);
  EXPECT_FLOAT_EQ(vae[0][0][0][0][0].item<float>(), 3.2001f + 0.5126f);
}

TEST(WanDecoderSharding, EveryBandNeedsOneLatentRow) {
  const std::unique_ptr<WanDecoder> d = *WanDecoder::Create(WanFamilySpec(), WanConfig(), "{}");
  EXPECT_TRUE(d->CheckExactSharding({1, 16, 4, 7, 5}, 2).ok());
  EXPECT_TRUE(d->CheckExactSharding({1, 16, 4, 7, 5}, 7).ok());  // bands of 1 row
  const absl::Status thin = d->CheckExactSharding({1, 16, 4, 7, 5}, 8);
  EXPECT_EQ(thin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(thin.message()),
              HasSubstr("latent height 7 over 8 ranks leaves a band of 0 rows, thinner than the conv halo"));
}

TEST(WanDecoderSharding, OnlyFramesAndBatchDoNotMatter) {
  const std::unique_ptr<WanDecoder> d = *WanDecoder::Create(WanFamilySpec(), WanConfig(), "{}");
  EXPECT_TRUE(d->CheckExactSharding({2, 16, 1, 3, 100}, 3).ok());
  EXPECT_TRUE(d->CheckExactSharding({1, 16, 21, 3, 1}, 3).ok());
}

TEST(WanDecoderSharding, WorldSizeOneAndImageLatentsAreRefused) {
  const std::unique_ptr<WanDecoder> d = *WanDecoder::Create(WanFamilySpec(), WanConfig(), "{}");
  EXPECT_EQ(d->CheckExactSharding({1, 16, 4, 7, 5}, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->CheckExactSharding({1, 16, 7, 5}, 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WanEncoder, RefusesConfigsDiffusersCannotEncodeWith) {
  WanConfig attention = WanConfig();
  attention.attn_scales = {1.0};
  EXPECT_THAT(WanEncoder::Create(WanFamilySpec(), attention).status().message(), HasSubstr("attn_scales"));
  WanConfig two_x = WanConfig();
  two_x.temperal_downsample = {false, false, true};
  EXPECT_THAT(WanEncoder::Create(WanFamilySpec(), two_x).status().message(), HasSubstr("chunks of 4 frames"));
}

TEST(WanEncoder, NamesTheFrameAndSizeRules) {
  const std::unique_ptr<WanEncoder> wan21 = *WanEncoder::Create(WanFamilySpec(), WanConfig());
  EXPECT_TRUE(wan21->ValidateImage(at::zeros({1, 3, 5, 25, 17})).ok());  // Wan 2.1 floors odd sizes
  EXPECT_EQ(wan21->LatentShape({1, 3, 5, 25, 17}), (std::vector<int64_t>{1, 16, 2, 3, 2}));
  EXPECT_THAT(wan21->ValidateImage(at::zeros({1, 3, 6, 24, 24})).message(), HasSubstr("1 + 4·k frames"));
  EXPECT_THAT(wan21->ValidateImage(at::zeros({1, 3, 1, 7, 24})).message(), HasSubstr("at least 8x8"));
  EXPECT_THAT(wan21->ValidateImage(at::zeros({1, 3, 24, 24})).message(), HasSubstr("[B, C, T, H, W]"));
  WanConfig c22 = WanConfig();
  c22.is_residual = true;
  c22.patch_size = 2;
  c22.in_channels = 12;
  c22.out_channels = 12;
  c22.z_dim = 48;
  c22.latents_mean.assign(48, 0.0);
  c22.latents_std.assign(48, 1.0);
  const std::unique_ptr<WanEncoder> wan22 = *WanEncoder::Create(WanFamilySpec(), c22);
  EXPECT_EQ(wan22->info().in_channels, 3);
  EXPECT_EQ(wan22->LatentShape({1, 3, 9, 32, 48}), (std::vector<int64_t>{1, 48, 3, 2, 3}));
  EXPECT_THAT(wan22->ValidateImage(at::zeros({1, 3, 1, 40, 48})).message(), HasSubstr("multiples of 16"));
  // Bands are cut in latent rows at every level: image rows 16 to a latent row, then 8, 4, 2, 1.
  const std::vector<RowLevel> levels = wan22->RowLevels(48);
  ASSERT_EQ(levels.size(), 5u);
  EXPECT_EQ(levels[0].rows, 48);
  EXPECT_EQ(levels[0].per_latent_row, 16);
  EXPECT_EQ(levels[1].rows, 24);
  EXPECT_EQ(levels[4].rows, 3);
}

}  // namespace
}  // namespace vaedecode::families::wan
