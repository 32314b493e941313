#include "server/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "rpc/latent_tensor.h"

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

v1::ModelInfo Model(bool video) {
  v1::ModelInfo m;
  m.set_name("m");
  m.set_latent_channels(16);
  m.set_out_channels(3);
  m.set_is_video(video);
  return m;
}

v1::DecodeRequest Request(std::vector<int64_t> shape, v1::DType dtype = v1::FLOAT32) {
  v1::DecodeRequest r;
  r.set_model("m");
  int64_t n = 1;
  for (int64_t d : shape) {
    r.mutable_latent()->add_shape(d);
    n *= d;
  }
  r.mutable_latent()->set_dtype(dtype);
  r.mutable_latent()->set_data(std::string(n * rpc::DTypeSize(dtype).value(), '\0'));
  return r;
}

TEST(RequestValidationTest, AcceptsWellFormedLatents) {
  EXPECT_TRUE(ValidateDecodeRequest(Request({2, 16, 5, 7}), Model(false)).ok());
  EXPECT_TRUE(ValidateDecodeRequest(Request({1, 16, 3, 5, 7}, v1::BFLOAT16), Model(true)).ok());
  v1::DecodeRequest png = Request({1, 16, 5, 7}, v1::FLOAT16);
  png.set_output_format(v1::OUTPUT_PNG);
  EXPECT_TRUE(ValidateDecodeRequest(png, Model(false)).ok());
}

TEST(RequestValidationTest, NamesTheProblem) {
  struct Case {
    std::function<void(v1::DecodeRequest&)> mutate;
    bool video;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.clear_latent(); }, false, "latent: missing"},
      {[](auto& r) { r.mutable_latent()->set_dtype(v1::UINT8); }, false, "UINT8 is not a floating"},
      {[](auto& r) { r.mutable_latent()->set_dtype(static_cast<v1::DType>(99)); }, false, "unknown value 99"},
      {[](auto& r) {}, true, "[B, C, T, H, W] latents (rank 5), got rank 4"},
      {[](auto& r) { r.mutable_latent()->set_shape(0, 0); }, false, "dimension 0 is 0"},
      {[](auto& r) { r.mutable_latent()->set_shape(1, 4); }, false, "takes 16 latent channels, got 4"},
      {[](auto& r) { r.mutable_latent()->mutable_data()->push_back('x'); }, false, "needs 2240"},
      {[](auto& r) { r.set_latent_space(static_cast<v1::LatentSpace>(3)); }, false, "latent_space"},
      {[](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(7)); }, false, "output_format"},
      {[](auto& r) { r.set_mode(static_cast<v1::Mode>(7)); }, false, "mode: unknown value 7"},
      {[](auto& r) { r.set_request_id(std::string(129, 'a')); }, false, "request_id"},
      {[](auto& r) { r.set_jpeg_quality(101); }, false, "jpeg_quality: 101"},
      {[](auto& r) { r.set_shift_factor(0.1); }, false, "shift_factor: set without scaling_factor"},
      {[](auto& r) { r.set_scaling_factor(0.18); }, false, "send latent_space RAW"},
      {[](auto& r) {
         r.set_latent_space(v1::LATENT_SPACE_RAW);
         r.set_scaling_factor(0);
       },
       false, "scaling_factor: 0; must be finite and non-zero"},
      {[](auto& r) {
         r.set_latent_space(v1::LATENT_SPACE_RAW);
         r.set_scaling_factor(0.3);
         r.set_shift_factor(std::numeric_limits<double>::infinity());
       },
       false, "shift_factor: inf; use a finite number"},
  };
  for (const Case& c : cases) {
    v1::DecodeRequest r = Request({1, 16, 5, 7});
    c.mutate(r);
    const absl::Status s = ValidateDecodeRequest(r, Model(c.video));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  v1::ModelInfo two = Model(false);
  two.set_out_channels(2);
  v1::DecodeRequest u8 = Request({1, 16, 5, 7});
  u8.set_output_format(v1::OUTPUT_UINT8);
  EXPECT_THAT(std::string(ValidateDecodeRequest(u8, two).message()), HasSubstr("1, 3 or 4 output channels"));
  v1::ModelInfo rgba = Model(false);
  rgba.set_out_channels(4);
  v1::DecodeRequest jpeg = Request({1, 16, 5, 7});
  jpeg.set_output_format(v1::OUTPUT_JPEG);
  EXPECT_TRUE(ValidateDecodeRequest(jpeg, Model(false)).ok());
  EXPECT_THAT(std::string(ValidateDecodeRequest(jpeg, rgba).message()), HasSubstr("jpeg needs 1 or 3"));
  v1::DecodeRequest mp4 = Request({1, 16, 5, 7});
  mp4.set_output_format(v1::OUTPUT_MP4);
  EXPECT_THAT(std::string(ValidateDecodeRequest(mp4, Model(false)).message()), HasSubstr("mp4 holds video"));
  v1::DecodeRequest clip = Request({1, 16, 3, 5, 7});
  clip.set_output_format(v1::OUTPUT_MP4);
  EXPECT_TRUE(ValidateDecodeRequest(clip, Model(true)).ok());
  clip.set_fps(500);
  EXPECT_THAT(std::string(ValidateDecodeRequest(clip, Model(true)).message()), HasSubstr("fps: 500"));
  // Scaling overrides: fine on raw latents, refused for packed ones.
  v1::DecodeRequest scaled = Request({1, 16, 5, 7});
  scaled.set_latent_space(v1::LATENT_SPACE_RAW);
  scaled.set_scaling_factor(0.3611);
  scaled.set_shift_factor(0.1159);
  EXPECT_TRUE(ValidateDecodeRequest(scaled, Model(false)).ok());
  // LTX's decode timestep and noise: only for timestep-conditioned models.
  v1::DecodeRequest noisy = Request({1, 16, 3, 5, 7});
  noisy.set_decode_timestep(0.05);
  noisy.set_noise_seed(3);
  EXPECT_THAT(std::string(ValidateDecodeRequest(noisy, Model(true)).message()), HasSubstr("not timestep-conditioned"));
  v1::ModelInfo ltx = Model(true);
  ltx.set_timestep_conditioning(true);
  EXPECT_TRUE(ValidateDecodeRequest(noisy, ltx).ok());
  noisy.set_decode_noise_scale(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(std::string(ValidateDecodeRequest(noisy, ltx).message()), HasSubstr("decode_noise_scale: nan"));
  v1::ModelInfo packed = Model(false);
  packed.set_raw_patch(2);
  packed.set_raw_latent_channels(16);
  EXPECT_THAT(std::string(ValidateDecodeRequest(scaled, packed).message()), HasSubstr("packed raw latents"));
}

TEST(RequestValidationTest, PredictsTheOutputOfImagesVideoAndPackedRawLatents) {
  v1::ModelInfo image = Model(false);
  image.set_spatial_factor(8);
  const OutputSize i = PredictOutputSize(Request({2, 16, 5, 7}), image);
  EXPECT_EQ(i.pixels(), 2 * 40 * 56);
  v1::ModelInfo video = Model(true);
  video.set_spatial_factor(8);
  video.set_temporal_factor(4);
  const OutputSize v = PredictOutputSize(Request({1, 16, 3, 5, 7}), video);
  EXPECT_EQ(v.frames, 9);  // 1 + 4 x (3 - 1)
  EXPECT_EQ(v.pixels(), 9 * 40 * 56);
  // A model with an output frame table (MiniMax-H3's windows): the table,
  // then its period, not the causal formula.
  for (int64_t frames : {0, 0, 0, 9, 13, 17, 18, 22, 26, 30}) video.add_output_frame_table(frames);
  video.set_output_frame_period(5);
  video.set_output_frames_per_period(17);
  EXPECT_EQ(PredictOutputSize(Request({1, 16, 6, 5, 7}), video).frames, 18);
  EXPECT_EQ(PredictOutputSize(Request({1, 16, 12, 5, 7}), video).frames, 39);
  image.set_raw_patch(2);
  v1::DecodeRequest raw = Request({1, 64, 5, 7});
  raw.set_latent_space(v1::LATENT_SPACE_RAW);
  EXPECT_EQ(PredictOutputSize(raw, image).height, 80);
}

// LTX-2's audio VAE with its vocoder (8 channels, 16 latent bins, 960
// samples per latent frame, a mel of 4 frames per latent frame and 64 bins)
// and MiniMax-H3's ([B, 32, L], 800 samples per latent frame).
v1::ModelInfo Ltx2Audio(int64_t sample_rate, int64_t mel_bins) {
  v1::ModelInfo m;
  m.set_name("a");
  m.set_is_audio(true);
  m.set_latent_channels(8);
  m.set_latent_bins(16);
  m.set_out_channels(2);
  m.set_sample_rate(sample_rate);
  m.set_samples_per_latent(sample_rate > 0 ? 960 : 0);
  m.set_mel_frames_per_latent(4);
  m.set_mel_bins(mel_bins);
  return m;
}

TEST(RequestValidationTest, AudioOutputsArePredictedAndBounded) {
  // A waveform: samples as rows of one column.
  v1::DecodeRequest wave = Request({2, 8, 10, 16});
  OutputSize out = PredictOutputSize(wave, Ltx2Audio(24000, 64));
  EXPECT_EQ(out.batch, 2);
  EXPECT_EQ(out.height, 9600);
  EXPECT_EQ(out.width, 1);
  EXPECT_TRUE(ValidateDecodeRequest(wave, Ltx2Audio(24000, 64)).ok());
  // The mel spectrogram (asked, or without a vocoder): frames x the config's bins ...
  v1::DecodeRequest mel = wave;
  mel.set_audio_output(v1::AUDIO_OUTPUT_MEL);
  out = PredictOutputSize(mel, Ltx2Audio(24000, 64));
  EXPECT_EQ(out.height, 40);
  EXPECT_EQ(out.width, 64);
  out = PredictOutputSize(wave, Ltx2Audio(0, 64));
  EXPECT_EQ(out.height, 40);
  EXPECT_EQ(out.width, 64);
  // ... or, mel_bins null, the latent's own bins (packed raw: C·M / C).
  v1::DecodeRequest packed = Request({1, 10, 8 * 40});
  packed.set_latent_space(v1::LATENT_SPACE_RAW);
  packed.set_audio_output(v1::AUDIO_OUTPUT_MEL);
  out = PredictOutputSize(packed, Ltx2Audio(24000, 0));
  EXPECT_EQ(out.height, 40);
  EXPECT_EQ(out.width, 40);
  EXPECT_EQ(PredictTensorOutputBytes(packed, Ltx2Audio(24000, 0)), 40 * 40 * 2 * 4);
  // A waveform longer than a stream's dimension may be: refused before any decode.
  v1::DecodeRequest lengthy = Request({1, 8, (int64_t{1} << 24) / 960 + 1, 16});
  EXPECT_THAT(std::string(ValidateDecodeRequest(lengthy, Ltx2Audio(24000, 64)).message()),
              HasSubstr("samples per channel, more than the 16777216 an output dimension may hold"));
}

TEST(RequestValidationTest, OutputPixelLimitsParseAndApplyPerModel) {
  absl::StatusOr<AdmissionLimits> limits = ParseOutputPixelLimits("5000,big=100000,small=10");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(limits->max_output_pixels, 5000);
  EXPECT_EQ(limits->max_output_pixels_per_model.at("big"), 100000);
  for (const char* bad : {"x", "1,2", "-5", "5,=3", "5,m=x"}) {
    const absl::Status s = ParseOutputPixelLimits(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--max_output_pixels")) << bad;
  }
  v1::ModelInfo m = Model(false);
  m.set_spatial_factor(8);
  const v1::DecodeRequest r = Request({2, 16, 5, 7});  // 4480 output pixels
  EXPECT_TRUE(CheckAdmission(r, m, *limits).ok());
  m.set_name("small");
  const absl::Status refused = CheckAdmission(r, m, *limits);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("decodes to 4480 output pixels"));
  EXPECT_THAT(refused.message(), HasSubstr("limit of 10 for model \"small\""));
  m.set_name("big");
  EXPECT_TRUE(CheckAdmission(r, m, *limits).ok());
  EXPECT_TRUE(CheckAdmission(r, m, AdmissionLimits()).ok());  // 0: no limit
}

// A frame's latent positions are bounded for models with attention only
// (one call attends over them all): a 1024 x 1024 latent held a CPU group 17
// minutes in one op.
TEST(RequestValidationTest, AttentionTokensAreBoundedForModelsWithAttention) {
  AdmissionLimits limits;
  limits.max_attention_tokens = kDefaultMaxAttentionTokens;
  v1::ModelInfo m = Model(false);
  m.set_spatial_factor(8);
  const v1::DecodeRequest fits = Request({1, 16, 512, 512});
  const v1::DecodeRequest over = Request({1, 16, 512, 513});
  EXPECT_TRUE(CheckAdmission(over, m, limits).ok()) << "no attention measured: no token bound";
  m.set_attention_bytes_per_latent(1000);
  EXPECT_TRUE(CheckAdmission(fits, m, limits).ok());
  const absl::Status refused = CheckAdmission(over, m, limits);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("512 x 513 = 262656 latent positions"));
  EXPECT_THAT(refused.message(), HasSubstr("limit of 262144 (--max_attention_tokens"));
  limits.max_attention_tokens = 0;
  EXPECT_TRUE(CheckAdmission(over, m, limits).ok());  // 0: no limit
}

TEST(RequestValidationTest, NonFiniteLatentsAreCountedAndRefusedUnlessAllowed) {
  v1::ModelInfo m = Model(false);
  v1::DecodeRequest r = Request({1, 16, 2, 2});
  std::string data = r.latent().data();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&data[4 * 5], &nan, 4);
  std::memcpy(&data[4 * 9], &inf, 4);
  r.mutable_latent()->set_data(data);
  const absl::Status s = CheckAdmission(r, m, AdmissionLimits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 of 64 values are not finite"));
  EXPECT_THAT(s.message(), HasSubstr("the first is element 5"));
  AdmissionLimits allowed;
  allowed.allow_non_finite = true;
  EXPECT_TRUE(CheckAdmission(r, m, allowed).ok());

  // float16 and bfloat16 bit patterns: 0x7C00 is +Inf in half, 0xFFC0 a bfloat16 NaN.
  for (auto [dtype, bits] : {std::pair{v1::FLOAT16, uint16_t{0x7C00}}, std::pair{v1::BFLOAT16, uint16_t{0xFFC0}}}) {
    v1::DecodeRequest h = Request({1, 16, 2, 2}, dtype);
    std::string d = h.latent().data();
    std::memcpy(&d[2 * 3], &bits, 2);
    h.mutable_latent()->set_data(d);
    EXPECT_THAT(CheckAdmission(h, m, AdmissionLimits()).message(), HasSubstr("1 of 64 values are not finite"));
  }

  // A finite float32 beyond float16's range overflows a float16 decode only.
  v1::DecodeRequest big = Request({1, 16, 2, 2});
  std::string b = big.latent().data();
  const float huge = 1e5f;
  std::memcpy(&b[0], &huge, 4);
  big.mutable_latent()->set_data(b);
  EXPECT_TRUE(CheckAdmission(big, m, AdmissionLimits()).ok());
  m.set_dtype("float16");
  EXPECT_THAT(CheckAdmission(big, m, AdmissionLimits()).message(), HasSubstr("exceed +-65504"));
}

}  // namespace
}  // namespace vaedecode::server
