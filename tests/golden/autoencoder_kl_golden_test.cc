// The dense AutoencoderKL decode reproduces diffusers on every AutoencoderKL
// fixture (FP32, max abs error <= 1e-4), from the decoder input and from the
// pipeline latent through the family's raw-space de-normalisation.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "families/builtin_families.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"
#include "worker/decode_job.h"

namespace vaedecode {
namespace {

constexpr double kFp32Tolerance = 1e-4;

class AutoencoderKLGolden : public ::testing::TestWithParam<testing::FixtureCase> {};

at::Tensor ReadOrDie(const std::string& path, const char* name) {
  absl::StatusOr<at::Tensor> t = formats::ReadTensorFile(path, name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::Tensor();
}

at::Tensor DecodeOrDie(families::Decoder& decoder, const at::Tensor& latent,
                       families::LatentSpace space) {
  families::DenseOps ops;
  absl::StatusOr<at::Tensor> sample = worker::RunDecode(decoder, {latent, space}, ops);
  EXPECT_TRUE(sample.ok()) << sample.status();
  return sample.ok() ? *sample : at::Tensor();
}

TEST_P(AutoencoderKLGolden, MatchesDiffusers) {
  const testing::FixtureCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(testing::FixturePath(c.fixture), {});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const at::Tensor expected = ReadOrDie(c.expected_file, "sample");

  const at::Tensor sample = DecodeOrDie(**decoder, ReadOrDie(c.latent_file, "latent"),
                                        families::LatentSpace::kVae);
  ASSERT_EQ(sample.sizes(), expected.sizes());
  EXPECT_LE((sample - expected).abs().max().item<double>(), kFp32Tolerance);

  if (!c.pipeline_latent_file.empty()) {
    const at::Tensor from_raw = DecodeOrDie(**decoder, ReadOrDie(c.pipeline_latent_file, "latent"),
                                            families::LatentSpace::kRaw);
    EXPECT_LE((from_raw - expected).abs().max().item<double>(), kFp32Tolerance);
  }
}

TEST_P(AutoencoderKLGolden, Bfloat16StaysNearReference) {
  // The fixtures README's bf16 gate: max abs <= 1, RMSE <= 0.05.
  const testing::FixtureCase& c = GetParam();
  families::LoadOptions options;
  options.dtype = at::kBFloat16;
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(testing::FixturePath(c.fixture), options);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const at::Tensor expected = ReadOrDie(c.expected_file, "sample");
  const at::Tensor sample = DecodeOrDie(**decoder, ReadOrDie(c.latent_file, "latent"),
                                        families::LatentSpace::kVae)
                                .to(at::kFloat);
  ASSERT_EQ(sample.sizes(), expected.sizes());
  const at::Tensor diff = sample - expected;
  EXPECT_LE(diff.abs().max().item<double>(), 1.0);
  EXPECT_LE(diff.pow(2).mean().sqrt().item<double>(), 0.05);
}

std::string CaseName(const ::testing::TestParamInfo<testing::FixtureCase>& info) {
  return info.param.fixture + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, AutoencoderKLGolden,
                         ::testing::ValuesIn(testing::FixtureCases({"AutoencoderKL"})), CaseName);

TEST(AutoencoderKLGoldenCoverage, EveryAutoencoderKLFixtureIsTested) {
  // sd_kl (main, b2) and flux1_kl (main) at the time of writing; never zero.
  EXPECT_GE(testing::FixtureCases({"AutoencoderKL"}).size(), 3u);
}

}  // namespace
}  // namespace vaedecode
