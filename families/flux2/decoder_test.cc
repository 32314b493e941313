#include "families/flux2/decoder.h"

#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "families/flux2/blocks.h"
#include "families/model_files.h"
#include "families/status_error.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families::flux2 {
namespace {

using ::testing::HasSubstr;

Flux2Config SmallConfig() {
  absl::StatusOr<Flux2Config> c = Flux2Config::FromJson(
      nlohmann::json{{"decoder_block_out_channels", {8, 16}}, {"norm_num_groups", 4}, {"latent_channels", 4}}, "small");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(Flux2Decoder, ParameterAndBufferNamesAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("flux2_kl"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::set<std::string> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "post_quant_conv.")) want.insert(name);
  }
  absl::StatusOr<Flux2Config> config = Flux2Config::FromJson((*files)->config(), "flux2_kl");
  ASSERT_TRUE(config.ok()) << config.status();
  Flux2Decoder decoder(*config, "{}");
  std::set<std::string> params, buffers;
  for (const auto& item : decoder.module()->named_parameters()) params.insert(item.key());
  for (const auto& item : decoder.module()->named_buffers()) buffers.insert(item.key());
  EXPECT_EQ(params, want);
  EXPECT_EQ(want.size(), 140u);  // 138 decoder.* + 2 post_quant_conv.* (fixtures README)
  EXPECT_EQ(buffers, (std::set<std::string>{"bn.running_mean", "bn.running_var"}));
}

TEST(Flux2Decoder, LoadsTheFixtureIgnoringEncoderAndBatchCounter) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("flux2_kl"));
  ASSERT_TRUE(files.ok()) << files.status();
  absl::StatusOr<std::unique_ptr<Decoder>> d = LoadFlux2(**files, {});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->info().family, "flux2");
  EXPECT_EQ((*d)->info().diffusers_class, "AutoencoderKLFlux2");
  EXPECT_EQ((*d)->info().latent_channels, 32);
  EXPECT_EQ((*d)->info().spatial_factor, 8);
  EXPECT_THAT((*d)->info().raw_to_vae_formula, HasSubstr("bn.running_var"));
  // diffusers' tiled_decode at the fixture's sample_size 256: 32-latent tiles every 24.
  EXPECT_EQ((*d)->info().stock_tile, 32);
  EXPECT_EQ((*d)->info().stock_stride, 24);
  auto* flux2 = static_cast<Flux2Decoder*>(d->get());
  // The running statistics were loaded (the fixture perturbed them).
  EXPECT_FALSE(flux2->module()->bn->running_var.equal(at::ones({128})));
}

TEST(Flux2Decoder, PatchConversionsAreInverseAndMatchThePipelineLayout) {
  at::manual_seed(1);
  const at::Tensor vae = at::randn({2, 3, 6, 4});
  const at::Tensor raw = PatchifyLatents(vae, 2, 2);
  EXPECT_EQ(raw.sizes(), (std::vector<int64_t>{2, 12, 3, 2}));
  EXPECT_TRUE(UnpatchifyLatents(raw, 2, 2).equal(vae));
  // Pixel (c, 2y + dy, 2x + dx) is raw channel 4c + 2dy + dx at (y, x).
  EXPECT_EQ(raw[1][4 * 2 + 2 * 1 + 0][2][1].item<float>(), vae[1][2][5][2].item<float>());
  EXPECT_EQ(raw[0][4 * 1 + 0 + 1][0][1].item<float>(), vae[0][1][0][3].item<float>());
}

TEST(Flux2Decoder, RawSpaceDenormalisesThenUnpatchifies) {
  Flux2Decoder decoder(SmallConfig(), "{}");
  {
    at::NoGradGuard no_grad;
    decoder.module()->bn->running_mean.copy_(at::arange(16, at::kFloat));
    decoder.module()->bn->running_var.fill_(4.0f - 1e-4f);
  }
  const at::Tensor raw = at::ones({1, 16, 2, 3});
  const at::Tensor z = decoder.ToVaeSpace(raw);
  ASSERT_EQ(z.sizes(), (std::vector<int64_t>{1, 4, 4, 6}));
  const at::Tensor want =
      UnpatchifyLatents(2.0f + at::arange(16, at::kFloat).view({1, 16, 1, 1}).expand({1, 16, 2, 3}), 2, 2);
  EXPECT_TRUE(at::allclose(z, want, 0, 1e-6));
}

TEST(Flux2Decoder, AcceptsVaeAndRawLayoutsAndNamesTheRightSpace) {
  Flux2Decoder decoder(SmallConfig(), "{}");
  EXPECT_TRUE(decoder.ValidateLatent(at::zeros({1, 4, 3, 3})).ok());
  EXPECT_TRUE(decoder.ValidateLatent(at::zeros({1, 16, 3, 3})).ok());
  EXPECT_THAT(std::string(decoder.ValidateLatent(at::zeros({1, 5, 3, 3})).message()),
              HasSubstr("(or 16 for a raw FLUX.2 pipeline latent)"));
  DenseOps ops;
  try {
    decoder.Decode(at::zeros({1, 16, 3, 3}), ops);
    ADD_FAILURE() << "a patched latent was decoded as a VAE-space one";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("decode it with latent space raw"));
  }
  try {
    decoder.ToVaeSpace(at::zeros({1, 4, 3, 3}));
    ADD_FAILURE() << "a VAE-space latent was de-normalised as a raw one";
  } catch (const StatusError& e) {
    EXPECT_THAT(e.what(), HasSubstr("latent space vae"));
  }
}

TEST(Flux2Decoder, OutputShapeForBothSpaces) {
  Flux2Decoder decoder(SmallConfig(), "{}");
  DenseOps ops;
  const at::Tensor out = decoder.Decode(at::randn({1, 4, 3, 5}), ops);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 3, 6, 10}));
  EXPECT_EQ(decoder.OutputShape({1, 4, 3, 5}), (std::vector<int64_t>{1, 3, 6, 10}));
  EXPECT_EQ(decoder.OutputShape({1, 16, 3, 5}), (std::vector<int64_t>{1, 3, 12, 20}));
}

TEST(Flux2Decoder, Bfloat16KeepsTheBatchNormStatisticsInFloat32) {
  Flux2Decoder decoder(SmallConfig(), "{}");
  decoder.ToDtype(at::kBFloat16);
  EXPECT_EQ(decoder.module()->decoder->conv_in->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(decoder.module()->bn->running_var.scalar_type(), at::kFloat);
  EXPECT_EQ(decoder.ToVaeSpace(at::ones({1, 16, 1, 1})).scalar_type(), at::kFloat);
}

TEST(Flux2Decoder, EveryBandNeedsOneVaeSpaceLatentRow) {
  // Shapes are VAE-space ones: a raw latent is unpacked before it is sharded.
  const Flux2Decoder d(SmallConfig(), "{}");
  EXPECT_TRUE(d.CheckExactSharding({1, 16, 3, 5}, 3).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 16, 2, 5}, 3).ok());
  EXPECT_TRUE(d.CheckExactSharding({1, 4, 4, 5}, 4).ok());
  EXPECT_FALSE(d.CheckExactSharding({1, 4, 4, 5}, 1).ok());
}

}  // namespace
}  // namespace vaedecode::families::flux2
