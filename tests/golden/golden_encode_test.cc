// Every family's dense encode reproduces diffusers on every encode case of
// ../shared/fixtures (FP32, max abs error <= 1e-4): the posterior's mean and
// log-variance, the seeded sample (its noise drawn bit for bit as
// torch.Generator().manual_seed(seed) draws it), and the latent the
// family's pipeline feeds its denoiser (`raw`). A class with encode cases
// and a family but no encoder yet must be on ClassesWithoutAnEncoderYet(),
// so a new encoder cannot go untested and a missing one is named.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "families/builtin_families.h"
#include "families/layer_ops.h"
#include "families/posterior.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "worker/encode_job.h"

namespace vaedecode {
namespace {

constexpr double kFp32Tolerance = 1e-4;

// Families that decode but do not encode yet (issue 32).
const std::vector<std::string>& ClassesWithoutAnEncoderYet() {
  // None today.
  static const auto* classes = new std::vector<std::string>{};
  return *classes;
}

std::vector<std::string> ClassesWithAnEncoder() {
  std::vector<std::string> out;
  for (const std::string& c : families::BuiltinFamilies().SupportedClasses()) {
    const families::FamilyRegistration* f = families::BuiltinFamilies().FindByClass(c);
    if (f->encoder_factory) out.push_back(c);
  }
  return out;
}

at::Tensor ReadOrDie(const std::string& path, const char* name) {
  absl::StatusOr<at::Tensor> t = formats::ReadTensorFile(path, name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::Tensor();
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double max_abs = (actual.to(at::kFloat) - expected.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(max_abs, kFp32Tolerance) << what;
  std::cout << what << ": max abs error " << max_abs << "\n";
}

worker::EncodeResult EncodeOrDie(families::Encoder& encoder, const worker::EncodeJob& job) {
  families::DenseOps ops;
  absl::StatusOr<worker::EncodeResult> result = worker::RunEncode(encoder, job, ops);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : worker::EncodeResult{};
}

class GoldenEncode : public ::testing::TestWithParam<testing::EncodeCase> {};

TEST_P(GoldenEncode, MatchesDiffusers) {
  const testing::EncodeCase& c = GetParam();
  const std::string what = c.fixture + "/" + c.name;
  absl::StatusOr<std::unique_ptr<families::Encoder>> encoder =
      families::BuiltinFamilies().LoadEncoder(testing::FixturePath(c.fixture), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const bool video = (*encoder)->info().is_video;
  auto read = [video](const std::string& path, const char* name) {
    return testing::InFamilyRank(ReadOrDie(path, name), video);
  };
  const at::Tensor image = read(c.image_file, "image");
  const at::Tensor mean = read(c.mean_file, "mean");
  EXPECT_EQ((*encoder)->LatentShape(image.sizes().vec()), mean.sizes().vec()) << what;

  worker::EncodeJob job{image};
  job.posterior = families::PosteriorOutput::kMoments;
  const worker::EncodeResult moments = EncodeOrDie(**encoder, job);
  ExpectClose(moments.mean, mean, what + " mean");
  if (!c.logvar_file.empty()) ExpectClose(moments.logvar, read(c.logvar_file, "logvar"), what + " logvar");
  // A class whose posterior is a log standard deviation (MiniMax-H3 audio): its log-variance is twice it.
  if (!c.logstd_file.empty()) ExpectClose(moments.logvar, read(c.logstd_file, "logstd") * 2, what + " 2 x logstd");

  // The noise is diffusers' to the bit; the sample within the tolerance.
  const at::Tensor noise = read(c.sample_file, "noise");
  EXPECT_TRUE(at::equal(families::SeededNoise(noise.sizes(), c.sample_seed), noise)) << what << " noise";
  job.posterior = families::PosteriorOutput::kSample;
  job.seed = c.sample_seed;
  const worker::EncodeResult sample = EncodeOrDie(**encoder, job);
  ExpectClose(sample.latent, read(c.sample_file, "sample"), what + " sample");
  EXPECT_EQ(sample.seed, job.seed);

  if (c.pipeline_encoded_file.empty()) return;
  job.latent_space = families::LatentSpace::kRaw;
  job.posterior = c.pipeline_uses_sample ? families::PosteriorOutput::kSample : families::PosteriorOutput::kMean;
  const worker::EncodeResult raw = EncodeOrDie(**encoder, job);
  ExpectClose(raw.latent, read(c.pipeline_encoded_file, "latent"), what + " pipeline latent (raw)");
}

TEST(GoldenEncode, MiniMaxH3EncodesInFloat32WhateverDtypeItIsServedIn) {
  // diffusers pins AutoencoderKLMiniMaxH3's encoder to float32
  // (_keep_in_fp32_modules): served in bfloat16, it still matches the
  // float32 fixture.
  absl::StatusOr<std::unique_ptr<families::Encoder>> encoder =
      families::BuiltinFamilies().LoadEncoder(testing::FixturePath("minimax_h3"), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  (*encoder)->ToDtype(at::kBFloat16);
  EXPECT_EQ((*encoder)->dtype(), at::kFloat);
  const worker::EncodeResult mean =
      EncodeOrDie(**encoder, {ReadOrDie(testing::FixturePath("minimax_h3/image.safetensors"), "image")});
  ExpectClose(mean.latent, ReadOrDie(testing::FixturePath("minimax_h3/posterior_mean.safetensors"), "mean"),
              "minimax_h3 served in bfloat16: mean");
}

TEST(GoldenEncode, RefusesMomentsInRawSpace) {
  const std::vector<testing::EncodeCase> cases = testing::EncodeCases(ClassesWithAnEncoder());
  ASSERT_FALSE(cases.empty());
  auto encoder = families::BuiltinFamilies().LoadEncoder(testing::FixturePath(cases[0].fixture), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  worker::EncodeJob job{ReadOrDie(cases[0].image_file, "image"), families::PosteriorOutput::kMoments};
  job.latent_space = families::LatentSpace::kRaw;
  families::DenseOps ops;
  const absl::StatusOr<worker::EncodeResult> result = worker::RunEncode(**encoder, job, ops);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
}

TEST(GoldenEncode, EveryFamilyWithEncodeCasesEncodesOrIsPending) {
  const std::vector<std::string> with = ClassesWithAnEncoder();
  const std::vector<std::string>& pending = ClassesWithoutAnEncoderYet();
  for (const std::string& c : families::BuiltinFamilies().SupportedClasses()) {
    const bool encodes = std::find(with.begin(), with.end(), c) != with.end();
    const bool is_pending = std::find(pending.begin(), pending.end(), c) != pending.end();
    if (encodes) {
      EXPECT_FALSE(is_pending) << c << " encodes now: take it off ClassesWithoutAnEncoderYet()";
    }
    if (!encodes && !testing::EncodeCases({c}).empty()) {
      EXPECT_TRUE(is_pending) << c << " has encode fixtures but no encoder";
    }
  }
}

TEST(GoldenEncode, AnEncoderTheFamilyCannotBuildStillDecodes) {
  // Another down block type: the decoder loads (it never builds the
  // encoder's blocks); the encoder is refused by name.
  const std::string dir = ::testing::TempDir() + "/other_down_blocks";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                             dir + "/diffusion_pytorch_model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(testing::FixturePath("sd_kl/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["down_block_types"] = {"DownEncoderBlock2D", "AttnDownEncoderBlock2D", "DownEncoderBlock2D"};
  std::ofstream(dir + "/config.json") << config.dump(2);
  EXPECT_TRUE(families::BuiltinFamilies().Load(dir, {}).ok());
  auto encoder = families::BuiltinFamilies().LoadEncoder(dir, {});
  ASSERT_FALSE(encoder.ok());
  EXPECT_NE(encoder.status().message().find("AttnDownEncoderBlock2D"), std::string::npos) << encoder.status();
}

TEST(GoldenEncode, ADecoderOnlyCheckpointSaysItCannotEncode) {
  // ltx2's weights file has no encoder.* keys (the fixtures README).
  auto encoder = families::BuiltinFamilies().LoadEncoder(testing::FixturePath("ltx2"), {});
  ASSERT_FALSE(encoder.ok());
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kFailedPrecondition) << encoder.status();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenEncode, ::testing::ValuesIn(testing::EncodeCases(ClassesWithAnEncoder())),
                         [](const ::testing::TestParamInfo<testing::EncodeCase>& info) {
                           return info.param.fixture + "_" + info.param.name;
                         });

}  // namespace
}  // namespace vaedecode
