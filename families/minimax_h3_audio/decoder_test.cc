#include "families/minimax_h3_audio/decoder.h"

#include "families/minimax_h3_audio/encoder.h"

#include <map>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "families/builtin_families.h"
#include "families/model_files.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"
#include "worker/decode_job.h"

namespace vaedecode::families::minimax_h3_audio {
namespace {

using ::testing::HasSubstr;

TEST(MiniMaxH3AudioDecoder, ParametersAndFilterBuffersAreTheDiffusersDecodeKeys) {
  absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath("minimax_h3_audio"));
  ASSERT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (absl::StartsWith(name, "decoder.") || absl::StartsWith(name, "dec_in_proj.")) want[name] = view->shape;
  }
  absl::StatusOr<MiniMaxH3AudioConfig> config = MiniMaxH3AudioConfig::FromJson((*files)->config(), "minimax_h3_audio");
  ASSERT_TRUE(config.ok()) << config.status();
  MiniMaxH3AudioDecoder decoder(*config, "{}");
  std::map<std::string, std::vector<int64_t>> have;
  for (const auto& item : decoder.module()->named_parameters()) have[item.key()] = item.value().sizes().vec();
  for (const auto& item : decoder.module()->named_buffers()) have[item.key()] = item.value().sizes().vec();
  EXPECT_EQ(have, want);
  EXPECT_EQ(want.size(), 306u);  // 82 of them the Kaiser-sinc filter buffers

  // The encode side: every other key.
  MiniMaxH3AudioEncoder encoder(*config);
  std::map<std::string, std::vector<int64_t>> want_encoder, have_encoder;
  for (const auto& [name, view] : (*files)->tensors()) {
    if (!want.count(name)) want_encoder[name] = view->shape;
  }
  for (const auto& item : encoder.parameters_module().named_parameters()) {
    have_encoder[item.key()] = item.value().sizes().vec();
  }
  for (const auto& item : encoder.parameters_module().named_buffers()) {
    have_encoder[item.key()] = item.value().sizes().vec();
  }
  EXPECT_EQ(have_encoder, want_encoder);
}

TEST(MiniMaxH3AudioDecoder, DescribesAWaveformAndStaysFloat32) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("minimax_h3_audio"), {});
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelInfo& info = (*d)->info();
  EXPECT_TRUE(info.is_audio);
  EXPECT_FALSE(info.is_video);
  EXPECT_EQ(info.sample_rate, 32000);
  EXPECT_EQ(info.samples_per_latent, 800);
  EXPECT_EQ((*d)->OutputShape({2, 32, 5}), (std::vector<int64_t>{2, 1, 4000}));
  EXPECT_TRUE((*d)->ValidateLatent(at::zeros({1, 32, 3})).ok());
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 32, 3, 3})).message()),
              HasSubstr("must be 3-D [B, C, L]"));
  EXPECT_THAT(std::string((*d)->ValidateLatent(at::zeros({1, 16, 3})).message()), HasSubstr("expects 32"));
  EXPECT_EQ((*d)->CheckStreaming().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE((*d)->CheckExactSharding({1, 32, 8}, 2).ok());
  EXPECT_TRUE(BuiltinFamilies().DecodesAudio(testing::FixturePath("minimax_h3_audio")).value_or(false));
  EXPECT_FALSE(BuiltinFamilies().DecodesAudio(testing::FixturePath("minimax_h3")).value_or(true));

  // Served in bfloat16, it still decodes in float32 (diffusers' _keep_in_fp32_modules) and matches.
  absl::StatusOr<std::unique_ptr<Decoder>> bf16 =
      BuiltinFamilies().Load(testing::FixturePath("minimax_h3_audio"), {at::kBFloat16});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  absl::StatusOr<at::Tensor> latent =
      formats::ReadTensorFile(testing::FixturePath("minimax_h3_audio/latent.safetensors"), "latent");
  absl::StatusOr<at::Tensor> expected =
      formats::ReadTensorFile(testing::FixturePath("minimax_h3_audio/expected.safetensors"), "sample");
  ASSERT_TRUE(latent.ok() && expected.ok());
  EXPECT_EQ((*bf16)->dtype(), at::kFloat);
  EXPECT_THAT(DecodeDtypeReason((*bf16)->info(), at::kBFloat16), HasSubstr("always runs in float32"));
  DenseOps ops;
  absl::StatusOr<at::Tensor> decoded = worker::RunDecode(**bf16, {*latent}, ops);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const at::Tensor& sample = *decoded;
  EXPECT_EQ(sample.scalar_type(), at::kFloat);
  EXPECT_LE((sample - *expected).abs().max().item<double>(), 1e-4);
}

}  // namespace
}  // namespace vaedecode::families::minimax_h3_audio
