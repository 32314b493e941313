#include "families/autoencoder_kl/decoder.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/autoencoder_kl/embedded_default.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "formats/tensor_file.h"
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
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override {
    return dense.Attention(q, k, v, layout);
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
  EXPECT_THAT(std::string(decoder.ValidateLatent(at::zeros({1, 4, 4})).message()), HasSubstr("must be 4-D"));
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

// A copy of the sd_kl fixture whose config sets force_upcast to `value`.
std::string SdKlWithForceUpcast(bool value) {
  const std::filesystem::path dir =
      std::filesystem::path(std::getenv("TEST_TMPDIR")) / (value ? "upcast_true" : "upcast_false");
  std::filesystem::create_directories(dir);
  std::ifstream in(testing::FixturePath("sd_kl/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["force_upcast"] = value;
  std::ofstream(dir / "config.json") << config.dump();
  std::filesystem::remove(dir / "diffusion_pytorch_model.safetensors");
  std::filesystem::create_symlink(testing::FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                                  dir / "diffusion_pytorch_model.safetensors");
  return dir.string();
}

TEST(Registry, Float16DecodesInFloat32WhenTheConfigForcesUpcast) {
  // diffusers' SDXL pipeline: vae.dtype == float16 and config.force_upcast
  // -> the decode runs in float32.
  LoadOptions options;
  options.dtype = at::kHalf;
  absl::StatusOr<std::unique_ptr<Decoder>> upcast = BuiltinFamilies().Load(SdKlWithForceUpcast(true), options);
  ASSERT_TRUE(upcast.ok()) << upcast.status();
  EXPECT_TRUE((*upcast)->info().force_upcast);
  EXPECT_EQ((*upcast)->dtype(), at::kFloat);
  EXPECT_THAT(DecodeDtypeReason((*upcast)->info(), at::kHalf), HasSubstr("force_upcast"));
  // Only float16 is upcast: bfloat16 has float32's range.
  EXPECT_EQ(DecodeDtype((*upcast)->info(), at::kBFloat16), at::kBFloat16);
  EXPECT_EQ(DecodeDtypeReason((*upcast)->info(), at::kBFloat16), "");
  EXPECT_EQ(DecodeDtype((*upcast)->info(), at::kFloat), at::kFloat);

  absl::StatusOr<std::unique_ptr<Decoder>> half = BuiltinFamilies().Load(SdKlWithForceUpcast(false), options);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_FALSE((*half)->info().force_upcast);
  EXPECT_EQ((*half)->dtype(), at::kHalf);
  EXPECT_EQ(DecodeDtypeReason((*half)->info(), at::kHalf), "");

  // And the float16 decode runs (LibTorch 2.x has CPU float16 kernels), near
  // the float32 one.
  absl::StatusOr<at::Tensor> latent =
      formats::ReadTensorFile(testing::FixturePath("sd_kl/latent.safetensors"), "latent");
  ASSERT_TRUE(latent.ok());
  DenseOps ops;
  const at::Tensor fp16 = (*half)->Decode(latent->to(at::kHalf), ops).to(at::kFloat);
  const at::Tensor fp32 = (*upcast)->Decode(*latent, ops);
  EXPECT_LE((fp16 - fp32).abs().max().item<double>(), 0.1);
}

TEST(Registry, DecoderDtypes) {
  EXPECT_TRUE(CheckDtypeSupported(at::kHalf).ok());
  EXPECT_TRUE(CheckDtypeSupported(at::kBFloat16).ok());
  EXPECT_FALSE(CheckDtypeSupported(at::kLong).ok());
}

TEST(Registry, SeededWeightsNeedOnlyTheConfig) {
  const std::filesystem::path dir = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "config_only";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::FixturePath("sd_kl/config.json"), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(BuiltinFamilies().Load(dir.string(), {}).status().code(), absl::StatusCode::kNotFound);
  LoadOptions options;
  options.seeded_weights = 7;
  absl::StatusOr<std::unique_ptr<Decoder>> a = BuiltinFamilies().Load(dir.string(), options);
  absl::StatusOr<std::unique_ptr<Decoder>> b = BuiltinFamilies().Load(dir.string(), options);
  options.seeded_weights = 8;
  absl::StatusOr<std::unique_ptr<Decoder>> c = BuiltinFamilies().Load(dir.string(), options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status();
  absl::StatusOr<at::Tensor> latent =
      formats::ReadTensorFile(testing::FixturePath("sd_kl/latent.safetensors"), "latent");
  ASSERT_TRUE(latent.ok());
  DenseOps ops;
  const at::Tensor xa = (*a)->Decode(*latent, ops), xb = (*b)->Decode(*latent, ops), xc = (*c)->Decode(*latent, ops);
  EXPECT_TRUE(xa.equal(xb));  // the same seed, the same decoder
  EXPECT_GT((xa - xc).abs().max().item<double>(), 1e-3);
  EXPECT_TRUE(xa.isfinite().all().item<bool>());
}

TEST(Registry, MissingFolderIsNotFound) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load("/nonexistent/model", {});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vaedecode::families::autoencoder_kl
