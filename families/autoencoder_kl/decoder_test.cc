#include "families/autoencoder_kl/decoder.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::autoencoder_kl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

AutoencoderKLConfig SmallConfig() {
  AutoencoderKLConfig c;
  c.block_out_channels = {8, 16};
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  return c;
}

TEST(AutoencoderKLDecoder, ParameterNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("sd_kl"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.")) want.insert(name);
  }
  absl::StatusOr<AutoencoderKLConfig> config = AutoencoderKLConfig::FromJson((*files)->config(), "sd_kl");
  ASSERT_TRUE(config.ok());
  AutoencoderKLDecoder decoder(*config, "{}");
  std::set<std::string> have;
  for (const auto& item : decoder.module()->named_parameters()) have.insert(item.key());
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 88u);  // 86 decoder.* + 2 post_quant_conv.* (fixtures README)
}

TEST(AutoencoderKLDecoder, WithoutPostQuantConvHasNoSuchParameters) {
  AutoencoderKLConfig c = SmallConfig();
  c.use_post_quant_conv = false;
  c.mid_block_add_attention = false;
  AutoencoderKLDecoder decoder(c, "{}");
  for (const auto& item : decoder.module()->named_parameters()) {
    EXPECT_FALSE(absl::StartsWith(item.key(), "post_quant_conv"));
    EXPECT_FALSE(absl::StrContains(item.key(), "attentions"));
  }
}

// Records the weight storage every row-coupled op is handed.
class RecordingOps : public LayerOps {
 public:
  at::Tensor Conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const ConvGeometry& g) override {
    seen.insert(w.data_ptr());
    seen.insert(b.data_ptr());
    return dense.Conv(x, w, b, g);
  }
  at::Tensor GroupNorm(const at::Tensor& x, int64_t groups, const at::Tensor& w, const at::Tensor& b,
                       double eps) override {
    seen.insert(w.data_ptr());
    seen.insert(b.data_ptr());
    return dense.GroupNorm(x, groups, w, b, eps);
  }
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t t) override {
    return dense.Attention(q, k, v, t);
  }
  std::set<const void*> seen;
  DenseOps dense;
};

TEST(AutoencoderKLDecoder, ShardedAndDenseDecodesRunTheLoadedParametersThemselves) {
  // The exact-sharding adapter is the LayerOps a decode runs through: the
  // ops receive the module's own parameter tensors (same storage), never
  // copies, so a sharded decode cannot drift from the loaded weights.
  AutoencoderKLConfig c = SmallConfig();
  AutoencoderKLDecoder decoder(c, "{}");
  std::set<const void*> parameters;
  for (const auto& item : decoder.module()->named_parameters()) parameters.insert(item.value().data_ptr());
  RecordingOps ops;
  decoder.Decode(at::randn({1, 4, 3, 3}), ops);
  ASSERT_FALSE(ops.seen.empty());
  for (const void* p : ops.seen) EXPECT_TRUE(parameters.count(p)) << "an op got a copy of a parameter";
  // Every conv and norm parameter reached an op (Linear q/k/v/out run locally).
  size_t conv_and_norm = 0;
  for (const auto& item : decoder.module()->named_parameters()) {
    if (!absl::StrContains(item.key(), "to_")) ++conv_and_norm;
  }
  EXPECT_EQ(ops.seen.size(), conv_and_norm);
}

TEST(AutoencoderKLDecoder, OutputShapeFollowsTheConfig) {
  AutoencoderKLDecoder decoder(SmallConfig(), "{}");
  DenseOps ops;
  at::Tensor out = decoder.Decode(at::randn({2, 4, 5, 3}), ops);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 10, 6}));
  EXPECT_EQ(decoder.OutputShape({2, 4, 5, 3}), (std::vector<int64_t>{2, 3, 10, 6}));
}

TEST(AutoencoderKLDecoder, RawSpaceAppliesScaleAndShift) {
  AutoencoderKLConfig c = SmallConfig();
  c.scaling_factor = 0.5;
  c.shift_factor = 0.25;
  AutoencoderKLDecoder decoder(c, "{}");
  at::Tensor z = decoder.ToVaeSpace(at::full({1, 4, 1, 1}, 1.0f));
  EXPECT_TRUE(z.equal(at::full({1, 4, 1, 1}, 2.25f)));
}

TEST(AutoencoderKLDecoder, RawSpaceUsesSdxlStatisticsWhenPresent) {
  AutoencoderKLConfig c = SmallConfig();
  c.scaling_factor = 0.5;
  c.latents_mean = std::vector<double>{1, 2, 3, 4};
  c.latents_std = std::vector<double>{2, 2, 2, 2};
  AutoencoderKLDecoder decoder(c, "{}");
  at::Tensor z = decoder.ToVaeSpace(at::ones({1, 4, 1, 1}));
  EXPECT_TRUE(z.flatten().equal(at::tensor({5.0f, 6.0f, 7.0f, 8.0f})));
}

TEST(AutoencoderKLDecoder, ValidatesLatentShapeAndChannels) {
  AutoencoderKLDecoder decoder(SmallConfig(), "{}");
  EXPECT_THAT(std::string(decoder.ValidateLatent(at::zeros({1, 3, 4, 4})).message()),
              HasSubstr("latent has 3 channels; AutoencoderKL expects 4"));
  EXPECT_THAT(std::string(decoder.ValidateLatent(at::zeros({1, 4, 4})).message()),
              HasSubstr("must be 4-D"));
  EXPECT_FALSE(decoder.ValidateLatent(at::zeros({1, 4, 0, 4})).ok());
  EXPECT_TRUE(decoder.ValidateLatent(at::zeros({1, 4, 4, 4})).ok());
}

// The embedded default's first and last conv_in weights, computed outside
// LibTorch from the SplitMix64 stream (seed 20261129, bound 1/6): a change
// here is a change of the default model.
constexpr float kConvInWeight0 = 0x1.71ac16p-5f;
constexpr float kConvInWeightLast = 0x1.4b8856p-7f;

TEST(EmbeddedDefault, IsAnSd1ShapedDecoderWithFixedWeights) {
  std::unique_ptr<Decoder> a = MakeEmbeddedDefault();
  std::unique_ptr<Decoder> b = MakeEmbeddedDefault();
  EXPECT_EQ(a->info().latent_channels, 4);
  EXPECT_EQ(a->info().spatial_factor, 8);
  auto* ka = static_cast<AutoencoderKLDecoder*>(a.get());
  auto* kb = static_cast<AutoencoderKLDecoder*>(b.get());
  auto pa = ka->module()->named_parameters();
  auto pb = kb->module()->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].value().equal(pb[i].value())) << pa[i].key();
  // The generator is ours, not LibTorch's: these values are the same on every
  // machine and LibTorch version. A change here changes the default model.
  const at::Tensor w = ka->module()->decoder->conv_in->weight.flatten();
  EXPECT_EQ(w[0].item<float>(), kConvInWeight0);
  EXPECT_EQ(w[w.numel() - 1].item<float>(), kConvInWeightLast);
  EXPECT_EQ(ka->config().block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_GT(a->info().parameter_count, 40'000'000);
}

TEST(EmbeddedDefault, DecodesDeterministically) {
  std::unique_ptr<Decoder> a = MakeEmbeddedDefault();
  DenseOps ops;
  at::manual_seed(0);
  at::Tensor z = at::randn({1, 4, 3, 2});
  at::Tensor x1 = a->Decode(z, ops);
  at::Tensor x2 = MakeEmbeddedDefault()->Decode(z, ops);
  EXPECT_EQ(x1.sizes(), (std::vector<int64_t>{1, 3, 24, 16}));
  EXPECT_TRUE(x1.equal(x2));
  EXPECT_TRUE(at::isfinite(x1).all().item<bool>());
}

TEST(Registry, UnknownClassIsRejectedWithTheSupportedList) {
  // A diffusers VAE class no family registers, next to real weights.
  const std::filesystem::path dir = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "unsupported_class";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"_class_name": "AutoencoderKLMochi"})";
  std::filesystem::create_symlink(testing::FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                                  dir / "diffusion_pytorch_model.safetensors");
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(dir.string(), {});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              AllOf(HasSubstr("AutoencoderKLMochi is not supported"), HasSubstr("AutoencoderKL, ")));
}

TEST(Registry, Float16IsRefusedOnCpu) {
  LoadOptions options;
  options.dtype = at::kHalf;
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("sd_kl"), options);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("float16 is not supported on the CPU"));
}

TEST(Registry, Float16LoadsForAGpu) {
  // Loaded (and converted) on the CPU; the worker then moves it to its GPU.
  LoadOptions options;
  options.dtype = at::kHalf;
  options.device = c10::Device(c10::kCUDA, 0);
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("sd_kl"), options);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->dtype(), at::kHalf);
  EXPECT_TRUE(CheckDtypeSupported(at::kHalf, c10::Device(c10::kCUDA, 1)).ok());
  EXPECT_FALSE(CheckDtypeSupported(at::kHalf, c10::Device(c10::kCPU)).ok());
  EXPECT_FALSE(CheckDtypeSupported(at::kLong, c10::Device(c10::kCUDA, 0)).ok());
}

TEST(Registry, MissingFolderIsNotFound) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load("/nonexistent/model", {});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vaedecode::families::autoencoder_kl
