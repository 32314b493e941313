// Every family's dense decode reproduces diffusers on every fixture in
// ../shared/fixtures (FP32, max abs error <= 1e-4): from the decoder input,
// and from the pipeline latent through the family's raw-space
// de-normalisation, which must land on the stored decoder input. bf16 stays
// within the fixtures README's gate. A fixture whose class no family
// registers fails the coverage test, so a new fixture cannot go untested.
//
// What each fixture exercises is in the fixtures README: AutoencoderKL
// (SD 3-level, FLUX.1), FLUX.2 (latent BatchNorm + 2x2 unpatchify, an odd
// height), Wan 2.1/2.2 (causal cache, clamp, unpatchify), Qwen-Image (RGBA,
// batch 2), HunyuanVideo (frame-causal attention, replicate padding), LTX-2
// (depth-to-space upsamplers, reflect padding, 4x4 unpatchify).

#include <algorithm>
#include <iostream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "families/builtin_families.h"
#include "formats/tensor_file.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "worker/decode_job.h"

namespace vaedecode {
namespace {

constexpr double kFp32Tolerance = 1e-4;
// The pipeline formula written another way moves the latent by ~2e-6 (README).
constexpr double kRawToVaeTolerance = 1e-5;

class Golden : public ::testing::TestWithParam<testing::FixtureCase> {};

at::Tensor ReadOrDie(const std::string& path, const char* name) {
  absl::StatusOr<at::Tensor> t = formats::ReadTensorFile(path, name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::Tensor();
}

// `mel`: an audio VAE with a vocoder stops at its mel spectrogram (what `expected` holds).
at::Tensor DecodeOrDie(families::Decoder& decoder, const at::Tensor& latent, families::LatentSpace space,
                       bool mel = false) {
  families::DenseOps ops;
  worker::DecodeJob job{latent, space};
  job.conditioning.mel_spectrogram = mel;
  absl::StatusOr<at::Tensor> sample = worker::RunDecode(decoder, job, ops);
  EXPECT_TRUE(sample.ok()) << sample.status();
  return sample.ok() ? *sample : at::Tensor();
}

TEST_P(Golden, MatchesDiffusers) {
  const testing::FixtureCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(testing::FixturePath(c.fixture), {});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const bool video = (*decoder)->info().is_video;
  const at::Tensor expected = testing::InFamilyRank(ReadOrDie(c.expected_file, "sample"), video);
  const at::Tensor latent = testing::InFamilyRank(ReadOrDie(c.latent_file, "latent"), video);
  const bool vocoder = !c.waveform_file.empty();
  // What a default decode returns: the waveform when the model has a vocoder.
  const at::Tensor output = vocoder ? ReadOrDie(c.waveform_file, "sample") : expected;
  EXPECT_EQ((*decoder)->OutputShape(latent.sizes().vec()), output.sizes().vec());

  const at::Tensor sample = DecodeOrDie(**decoder, latent, families::LatentSpace::kVae, vocoder);
  ASSERT_EQ(sample.sizes(), expected.sizes());
  const double max_abs = (sample - expected).abs().max().item<double>();
  EXPECT_LE(max_abs, kFp32Tolerance);
  std::cout << c.fixture << "/" << c.name << " dense max abs error " << max_abs << "\n";
  if (vocoder) {
    const at::Tensor waveform = DecodeOrDie(**decoder, latent, families::LatentSpace::kVae);
    ASSERT_EQ(waveform.sizes(), output.sizes());
    const double waveform_max_abs = (waveform - output).abs().max().item<double>();
    EXPECT_LE(waveform_max_abs, kFp32Tolerance);
    std::cout << c.fixture << "/" << c.name << " waveform max abs error " << waveform_max_abs << "\n";
  }

  if (c.pipeline_latent_file.empty()) return;
  const at::Tensor raw = ReadOrDie(c.pipeline_latent_file, "latent");
  EXPECT_EQ((*decoder)->OutputShape(raw.sizes().vec()), output.sizes().vec());
  EXPECT_LE(((*decoder)->ToVaeSpace(raw) - latent).abs().max().item<double>(), kRawToVaeTolerance);
  const at::Tensor from_raw = DecodeOrDie(**decoder, raw, families::LatentSpace::kRaw, vocoder);
  ASSERT_EQ(from_raw.sizes(), expected.sizes());
  const double raw_max_abs = (from_raw - expected).abs().max().item<double>();
  EXPECT_LE(raw_max_abs, kFp32Tolerance);
  std::cout << c.fixture << "/" << c.name << " from raw max abs error " << raw_max_abs << "\n";
}

// A decoder that streams (sessions: one latent frame at a time through its
// DecodeStream, the last ending the clip) gives the whole decode's frames
// bit for bit; one that does not says why, naming its class.
TEST_P(Golden, StreamsFrameByFrameOrSaysWhyNot) {
  const testing::FixtureCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(testing::FixturePath(c.fixture), {});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const absl::Status streams = (*decoder)->CheckStreaming();
  if (!streams.ok()) {
    EXPECT_EQ(streams.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(streams.message().find((*decoder)->info().diffusers_class), std::string::npos) << streams;
    EXPECT_EQ((*decoder)->OpenStream(), nullptr);
    return;
  }
  const at::Tensor latent = ReadOrDie(c.latent_file, "latent");
  ASSERT_EQ(latent.dim(), 5) << "an image model streams";
  const at::Tensor whole = DecodeOrDie(**decoder, latent, families::LatentSpace::kVae);
  std::unique_ptr<families::DecodeStream> stream = (*decoder)->OpenStream();
  ASSERT_NE(stream, nullptr);
  families::DenseOps ops;
  std::vector<at::Tensor> frames;
  for (int64_t t = 0; t < latent.size(2); ++t) {
    // The last frame ends the clip (a window stream returns what it held then).
    const bool last = t + 1 == latent.size(2);
    frames.push_back(stream->DecodeChunk(latent.narrow(2, t, 1), ops, last));
    EXPECT_EQ(stream->latent_frames(), t + 1);
    if (!last) {
      EXPECT_GT(stream->state_bytes(), 0);
    }
  }
  EXPECT_TRUE(at::cat(frames, 2).equal(whole)) << c.fixture << "/" << c.name << ": streamed frames differ";
}

TEST_P(Golden, Bfloat16StaysNearReference) {
  // The fixtures README's bf16 gate: max abs <= 1, RMSE <= 0.05.
  const testing::FixtureCase& c = GetParam();
  families::LoadOptions options;
  options.dtype = at::kBFloat16;
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder =
      families::BuiltinFamilies().Load(testing::FixturePath(c.fixture), options);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const bool video = (*decoder)->info().is_video;
  const at::Tensor expected = testing::InFamilyRank(ReadOrDie(c.expected_file, "sample"), video);
  const at::Tensor sample = DecodeOrDie(**decoder, testing::InFamilyRank(ReadOrDie(c.latent_file, "latent"), video),
                                        families::LatentSpace::kVae, !c.waveform_file.empty())
                                .to(at::kFloat);
  ASSERT_EQ(sample.sizes(), expected.sizes());
  const at::Tensor diff = sample - expected;
  EXPECT_LE(diff.abs().max().item<double>(), 1.0);
  EXPECT_LE(diff.pow(2).mean().sqrt().item<double>(), 0.05);
}

std::string CaseName(const ::testing::TestParamInfo<testing::FixtureCase>& info) {
  return info.param.fixture + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(testing::AllFixtureCases()), CaseName);

TEST(GoldenCoverage, EveryFixtureBelongsToARegisteredFamily) {
  const std::vector<testing::FixtureCase> cases = testing::IndexFixtureCases();
  EXPECT_GE(cases.size(), 18u);  // 11 fixtures, 18 cases at the time of writing
  EXPECT_GE(testing::AllFixtureCases().size(), 12u);
  const std::vector<std::string>& pending = testing::ClassesWithoutAFamilyYet();
  for (const testing::FixtureCase& c : cases) {
    const bool registered = families::BuiltinFamilies().FindByClass(c.diffusers_class) != nullptr;
    if (std::find(pending.begin(), pending.end(), c.diffusers_class) != pending.end()) {
      EXPECT_FALSE(registered) << c.diffusers_class << " has a family now: take it off ClassesWithoutAFamilyYet()";
    } else {
      EXPECT_TRUE(registered) << c.fixture << ": no family registers " << c.diffusers_class;
    }
  }
}

}  // namespace
}  // namespace vaedecode
