// Audio VAEs through the service, end to end: a vaedecode_server process with
// a real two-rank CPU group serving MiniMax-H3's audio VAE and LTX-2's audio
// VAE with its vocoder beside an image model. Their latents decode densely on
// the leader (whatever the mode asked) to the diffusers fixtures' waveforms,
// as float32 tensors with the sample rate in the header and as WAV files
// (16-bit PCM and float32), LTX-2's mel spectrogram on request; requests an
// audio VAE cannot serve are refused naming the problem.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_io.h"
#include "formats/mp4.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

struct AudioCase {
  std::string model;
  std::string latent;  // in VAE space
  std::string waveform;
};

// The fixtures' decodes: MiniMax-H3 (stereo as a batch of 2 mono entries)
// and LTX-2 (a stereo waveform through the vocoder, batch 1 and 2).
std::vector<AudioCase> Cases() {
  return {{"minimax_h3_audio", "minimax_h3_audio/latent.safetensors", "minimax_h3_audio/expected.safetensors"},
          {"minimax_h3_audio", "minimax_h3_audio/latent_m1.safetensors", "minimax_h3_audio/expected_m1.safetensors"},
          {"ltx2_audio", "ltx2_audio/latent.safetensors", "ltx2_audio/waveform.safetensors"},
          {"ltx2_audio", "ltx2_audio/latent_b2.safetensors", "ltx2_audio/waveform_b2.safetensors"}};
}

v1::ModelInfo GetModel(ServerProcess& server, const std::string& name) {
  grpc::ClientContext context;
  v1::GetModelRequest get;
  get.set_name(name);
  v1::ModelInfo model;
  const grpc::Status status = server.stub().GetModel(&context, get, &model);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return model;
}

void ExpectTensor(const DecodeOutcome& out, const FloatTensor& expected, const std::string& what) {
  ASSERT_TRUE(out.status.ok()) << what << ": " << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << what << ": " << out.stream_error;
  ASSERT_TRUE(out.output.Finish().ok()) << what;
  EXPECT_EQ(Shape(out.output.header()), expected.shape) << what;
  EXPECT_LE(MaxAbsDiff(AsFloats(out), expected.data), 1e-4) << what;
}

// A WAV file's fields, read as RIFF says (the writer is formats/wav.h).
struct WavFile {
  int format_tag = 0, channels = 0, bits = 0;
  int64_t sample_rate = 0;
  std::vector<float> samples;  // interleaved
};

WavFile ParseWav(const std::string& bytes) {
  WavFile w;
  const auto u16 = [&](size_t at) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + at, 2);
    return static_cast<int>(v);
  };
  const auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    return static_cast<int64_t>(v);
  };
  EXPECT_GE(bytes.size(), 44u);
  if (bytes.size() < 44) return w;
  EXPECT_EQ(bytes.substr(0, 4), "RIFF");
  EXPECT_EQ(bytes.substr(8, 4), "WAVE");
  EXPECT_EQ(u32(4), static_cast<int64_t>(bytes.size()) - 8);
  for (size_t at = 12; at + 8 <= bytes.size();) {
    const std::string id = bytes.substr(at, 4);
    const int64_t size = u32(at + 4);
    if (id == "fmt ") {
      w.format_tag = u16(at + 8);
      w.channels = u16(at + 10);
      w.sample_rate = u32(at + 12);
      w.bits = u16(at + 22);
    } else if (id == "data") {
      const size_t n = static_cast<size_t>(size) / (w.bits / 8);
      EXPECT_EQ(at + 8 + static_cast<size_t>(size), bytes.size());
      for (size_t i = 0; i < n; ++i) {
        if (w.bits == 16) {
          int16_t s;
          std::memcpy(&s, bytes.data() + at + 8 + 2 * i, 2);
          w.samples.push_back(static_cast<float>(s) / 32767.0f);
        } else {
          float f;
          std::memcpy(&f, bytes.data() + at + 8 + 4 * i, 4);
          w.samples.push_back(f);
        }
      }
    }
    at += 8 + static_cast<size_t>(size) + (size & 1);
  }
  return w;
}

// Batch entry b of a waveform [B, C, S], interleaved as a WAV holds it.
std::vector<float> Interleaved(const FloatTensor& wave, int64_t b) {
  const int64_t C = wave.shape[1], S = wave.shape[2];
  std::vector<float> out;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t c = 0; c < C; ++c) out.push_back(wave.data[(b * C + c) * S + s]);
  }
  return out;
}

TEST(AudioServiceTest, AudioVaesDecodeThroughGrpcToTheFixturesWaveforms) {
  const std::vector<std::string> fixtures = {"minimax_h3_audio", "ltx2_audio", "sd_kl"};
  // Small chunks: a waveform streams in many sample ranges.
  std::unique_ptr<ServerProcess> server =
      StartServing(RealWorkerFlags(FixtureRepository(fixtures), "cpu:2", 2, {"--chunk_bytes=4096"}), fixtures);
  ASSERT_NE(server, nullptr);

  // Listed as audio models, with their rates and layouts.
  const v1::ModelInfo minimax = GetModel(*server, "minimax_h3_audio");
  const v1::ModelInfo ltx2 = GetModel(*server, "ltx2_audio");
  EXPECT_TRUE(minimax.is_audio());
  EXPECT_TRUE(ltx2.is_audio());
  EXPECT_EQ(minimax.latent_bins(), 0);
  EXPECT_GT(ltx2.latent_bins(), 0);
  EXPECT_GT(minimax.sample_rate(), 0);
  EXPECT_EQ(ltx2.sample_rate(), 24000);           // the vocoder's output rate
  EXPECT_GT(minimax.peak_bytes_per_latent(), 0);  // calibrated on audio latents
  EXPECT_GT(ltx2.peak_bytes_per_latent(), 0);
  EXPECT_EQ(minimax.supported_modes_size(), 1);  // DENSE only

  for (const AudioCase& c : Cases()) {
    const std::string what = c.latent;
    SCOPED_TRACE(what);
    const FloatTensor wave = ReadFloat(FixturePath(c.waveform), "sample");
    const int64_t rate = c.model == "ltx2_audio" ? ltx2.sample_rate() : minimax.sample_rate();
    // AUTO on a two-rank group: dense on the leader.
    const DecodeOutcome tensor =
        Decode(server->stub(), FixtureRequest(c.model, FixturePath(c.latent), v1::OUTPUT_FLOAT32, v1::MODE_AUTO));
    ExpectTensor(tensor, wave, what);
    const v1::Header& h = tensor.output.header();
    EXPECT_EQ(h.sample_rate(), rate);
    EXPECT_EQ(h.mode(), v1::MODE_DENSE);
    EXPECT_EQ(h.degree(), 1);
    EXPECT_GT(tensor.output.chunks(), 1);  // sample ranges of 4 KiB

    // One WAV per batch entry, 16-bit and float32.
    for (const v1::OutputFormat format : {v1::OUTPUT_WAV, v1::OUTPUT_WAV_FLOAT32}) {
      const DecodeOutcome wav = Decode(server->stub(), FixtureRequest(c.model, FixturePath(c.latent), format, {}));
      ASSERT_TRUE(wav.status.ok()) << wav.status.error_message();
      ASSERT_TRUE(wav.output.Finish().ok());
      EXPECT_EQ(wav.output.header().sample_rate(), rate);
      ASSERT_EQ(static_cast<int64_t>(wav.output.images().size()), wave.shape[0]);
      for (int64_t b = 0; b < wave.shape[0]; ++b) {
        const WavFile file = ParseWav(wav.output.images()[b]);
        EXPECT_EQ(file.format_tag, format == v1::OUTPUT_WAV ? 1 : 3);
        EXPECT_EQ(file.channels, wave.shape[1]);
        EXPECT_EQ(file.sample_rate, rate);
        const std::vector<float> want = Interleaved(wave, b);
        ASSERT_EQ(file.samples.size(), want.size());
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double clamped = std::clamp(static_cast<double>(want[i]), -1.0, 1.0);
          worst = std::max(worst, std::fabs(file.samples[i] - clamped));
        }
        // 16-bit PCM rounds to 1/32767; float32 samples are the waveform's.
        EXPECT_LE(worst, format == v1::OUTPUT_WAV ? 1.0 / 32767 : 1e-4) << b;
      }
    }
  }

  // The pipeline's latents, raw: MiniMax-H3's [B, C, L] and LTX-2's packed
  // [B, L, C·M], de-normalised by the family.
  for (const auto& [model, latent, waveform] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"minimax_h3_audio", "minimax_h3_audio/pipeline_latent.safetensors",
            "minimax_h3_audio/expected.safetensors"},
           {"ltx2_audio", "ltx2_audio/pipeline_latent.safetensors", "ltx2_audio/waveform.safetensors"}}) {
    v1::DecodeRequest raw = FixtureRequest(model, FixturePath(latent), v1::OUTPUT_FLOAT32, v1::MODE_AUTO);
    raw.set_latent_space(v1::LATENT_SPACE_RAW);
    ExpectTensor(Decode(server->stub(), raw), ReadFloat(FixturePath(waveform), "sample"), latent);
  }

  // LTX-2's mel spectrogram on request: [B, C, frames, mel_bins], no rate.
  v1::DecodeRequest mel =
      FixtureRequest("ltx2_audio", FixturePath("ltx2_audio/latent.safetensors"), v1::OUTPUT_FLOAT32, v1::MODE_AUTO);
  mel.set_audio_output(v1::AUDIO_OUTPUT_MEL);
  const DecodeOutcome mel_out = Decode(server->stub(), mel);
  ExpectTensor(mel_out, ReadFloat(FixturePath("ltx2_audio/expected.safetensors"), "sample"), "mel");
  EXPECT_EQ(mel_out.output.header().sample_rate(), 0);

  // Refused, naming the problem; the server keeps serving.
  const auto refused = [&](v1::DecodeRequest r, grpc::StatusCode code, const std::string& says) {
    const DecodeOutcome out = Decode(server->stub(), r);
    EXPECT_EQ(out.status.error_code(), code) << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(says));
  };
  const std::string minimax_latent = FixturePath("minimax_h3_audio/latent.safetensors");
  refused(FixtureRequest("minimax_h3_audio", minimax_latent, v1::OUTPUT_PNG, {}), grpc::StatusCode::INVALID_ARGUMENT,
          "png holds images or video; model \"minimax_h3_audio\" decodes audio waveforms (use float32, float16, wav");
  refused(FixtureRequest("minimax_h3_audio", minimax_latent, v1::OUTPUT_FLOAT32, v1::MODE_EXACT),
          grpc::StatusCode::INVALID_ARGUMENT, "cannot be decoded in EXACT mode");
  refused(FixtureRequest("minimax_h3_audio", minimax_latent, v1::OUTPUT_FLOAT32, v1::MODE_TILED),
          grpc::StatusCode::INVALID_ARGUMENT, "cannot be decoded in TILED mode");
  v1::DecodeRequest mel_wav = mel;
  mel_wav.set_output_format(v1::OUTPUT_WAV);
  refused(mel_wav, grpc::StatusCode::INVALID_ARGUMENT, "wav holds audio waveforms; model \"ltx2_audio\" decodes mel");
  refused(SyntheticRequest("minimax_h3_audio", {1, 32, 4, 4}), grpc::StatusCode::INVALID_ARGUMENT,
          "takes [B, C, L] latents, got [1, 32, 4, 4]");
  refused(SyntheticRequest("minimax_h3_audio", {1, 8, 5}), grpc::StatusCode::INVALID_ARGUMENT,
          "takes 32 latent channels, got 8");
  refused(SyntheticRequest("ltx2_audio", {1, 6, 8}), grpc::StatusCode::INVALID_ARGUMENT,
          "the pipeline's packed [B, L, C*M] with latent_space RAW");
  v1::DecodeRequest image_mel = SyntheticRequest("sd_kl", {1, 4, 8, 8});
  image_mel.set_audio_output(v1::AUDIO_OUTPUT_MEL);
  refused(image_mel, grpc::StatusCode::INVALID_ARGUMENT, "audio_output: MEL is an audio VAE's mel spectrogram");
  // A packed raw latent whose C·M the statistics do not cover: the family's check.
  v1::DecodeRequest bad_packed = SyntheticRequest("ltx2_audio", {1, 6, 12});
  bad_packed.set_latent_space(v1::LATENT_SPACE_RAW);
  refused(bad_packed, grpc::StatusCode::INVALID_ARGUMENT, "packed features");

  // The image model beside them still decodes.
  ExpectOk(Decode(server->stub(), SyntheticRequest("sd_kl", {1, 4, 8, 8})));
}

// A video latent with an audio latent beside it: one MP4 per clip, its AAC
// track the whole waveform the audio model decodes (as diffusers'
// encode_video writes LTX-2's), read back by FFmpeg.
TEST(AudioServiceTest, AnAudioLatentIsMuxedIntoTheVideosMp4) {
  const std::vector<std::string> fixtures = {"ltx2_full", "ltx2_audio", "minimax_h3", "minimax_h3_audio"};
  std::unique_ptr<ServerProcess> server =
      StartServing(RealWorkerFlags(FixtureRepository(fixtures), "cpu:2", 2, {"--chunk_bytes=65536"}), fixtures);
  ASSERT_NE(server, nullptr);
  struct MuxCase {
    std::string video_model, video_latent, audio_model, audio_latent, waveform;
    int64_t frames;
  };
  // LTX-2: a clip and a batch of 2 (stereo audio each); MiniMax-H3: one
  // clip whose stereo audio is its mono model's batch of 2.
  for (const MuxCase& c :
       std::vector<MuxCase>{{"ltx2_full", "ltx2_full/latent.safetensors", "ltx2_audio", "ltx2_audio/latent.safetensors",
                             "ltx2_audio/waveform.safetensors", 1},
                            {"ltx2_full", "ltx2_full/latent_b2.safetensors", "ltx2_audio",
                             "ltx2_audio/latent_b2.safetensors", "ltx2_audio/waveform_b2.safetensors", 1},
                            {"minimax_h3", "minimax_h3/latent.safetensors", "minimax_h3_audio",
                             "minimax_h3_audio/latent.safetensors", "minimax_h3_audio/expected.safetensors", 30}}) {
    SCOPED_TRACE(c.video_latent);
    v1::DecodeRequest r = FixtureRequest(c.video_model, FixturePath(c.video_latent), v1::OUTPUT_MP4, v1::MODE_AUTO);
    absl::StatusOr<v1::Tensor> audio = client::ReadLatent(FixturePath(c.audio_latent));
    ASSERT_TRUE(audio.ok()) << audio.status();
    *r.mutable_audio_latent() = *audio;
    r.set_audio_model(c.audio_model);
    const DecodeOutcome out = Decode(server->stub(), r);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    ASSERT_TRUE(out.output.Finish().ok());
    const FloatTensor wave = ReadFloat(FixturePath(c.waveform), "sample");
    const int64_t clips = r.latent().shape(0);
    const int64_t samples = wave.shape[2];
    const int64_t rate = c.audio_model == "ltx2_audio" ? 24000 : GetModel(*server, c.audio_model).sample_rate();
    ASSERT_EQ(static_cast<int64_t>(out.output.images().size()), clips);
    for (int64_t b = 0; b < clips; ++b) {
      absl::StatusOr<formats::DecodedVideo> mp4 = formats::DecodeMp4(out.output.images()[b]);
      ASSERT_TRUE(mp4.ok()) << mp4.status();
      EXPECT_EQ(static_cast<int64_t>(mp4->frames.size()), c.frames);
      EXPECT_EQ(mp4->audio_channels, 2);
      EXPECT_EQ(mp4->audio_sample_rate, rate);
      // Every sample (AAC's 1024-sample frames round the end up).
      EXPECT_NEAR(mp4->audio_seconds, static_cast<double>(samples) / rate, 1024.0 / rate) << b;
    }
  }

  // Refused, naming the problem.
  const auto refused = [&](const v1::DecodeRequest& r, const std::string& says) {
    const DecodeOutcome out = Decode(server->stub(), r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(says));
  };
  v1::DecodeRequest base =
      FixtureRequest("ltx2_full", FixturePath("ltx2_full/latent.safetensors"), v1::OUTPUT_MP4, v1::MODE_AUTO);
  *base.mutable_audio_latent() = *client::ReadLatent(FixturePath("ltx2_audio/latent.safetensors"));
  base.set_audio_model("ltx2_audio");
  v1::DecodeRequest tensor = base;
  tensor.set_output_format(v1::OUTPUT_FLOAT32);
  refused(tensor, "audio_latent: an audio track is muxed into an MP4");
  v1::DecodeRequest not_audio = base;
  not_audio.set_audio_model("minimax_h3");
  refused(not_audio, "audio_model: \"minimax_h3\" is not an audio VAE");
  v1::DecodeRequest batch = base;
  *batch.mutable_audio_latent() = *client::ReadLatent(FixturePath("ltx2_audio/latent_b2.safetensors"));
  refused(batch, "audio_latent.shape: a batch of 2 beside the video latent's 1");
  v1::DecodeRequest bad_shape = base;
  *bad_shape.mutable_audio_latent() = client::DemoLatent({1, 4, 6}, 3);
  refused(bad_shape, "audio_latent.shape: model \"ltx2_audio\" (an audio VAE) takes [B, C, L, M]");
  v1::DecodeRequest unknown = base;
  unknown.set_audio_model("nope");
  const DecodeOutcome missing = Decode(server->stub(), unknown);
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::NOT_FOUND) << missing.status.error_message();
  EXPECT_THAT(missing.status.error_message(), HasSubstr("audio_model: "));
}

}  // namespace
}  // namespace vaedecode::testing
