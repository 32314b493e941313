// Encode through the service, end to end: a vaedecode_server process with
// real vaedecode_worker groups (two ranks, Gloo on CPU) over the diffusers
// fixtures; the image streamed in pieces over gRPC, the latent streamed
// back. Every encode case of the families that encode matches diffusers
// (mean in AUTO = exact, the seeded sample dense, the pipeline latent raw,
// moments), a PNG encodes, and bad requests get clear statuses while the
// server keeps serving.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/png.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// An encode request of a fixture's image tensor (FLOAT32).
v1::EncodeRequest ImageRequest(const std::string& model, const std::string& image_file) {
  const FloatTensor image = ReadFloat(image_file, "image");
  v1::EncodeRequest r;
  r.set_model(model);
  v1::Tensor* t = r.mutable_image();
  t->set_dtype(v1::FLOAT32);
  for (int64_t d : image.shape) t->add_shape(d);
  t->set_data(std::string(reinterpret_cast<const char*>(image.data.data()), image.data.size() * 4));
  return r;
}

void ExpectLatent(const DecodeOutcome& out, const FloatTensor& expected, const std::string& what) {
  ASSERT_TRUE(out.status.ok()) << what << ": " << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << what << ": " << out.stream_error;
  EXPECT_EQ(Shape(out.output.header()), expected.shape) << what;
  EXPECT_LE(MaxAbsDiff(AsFloats(out), expected.data), 1e-4) << what;
}

TEST(EncodeServiceTest, EveryEncodeCaseMatchesDiffusersThroughGrpc) {
  const std::vector<std::string> fixtures = {"sd_kl",        "flux1_kl",       "flux2_kl",    "wan21",
                                             "wan22",        "qwenimage",      "qwenimage21", "hunyuanimage21",
                                             "hunyuanvideo", "hunyuanvideo15", "ltx2_full",   "minimax_h3"};
  const std::string repo = FixtureRepository(fixtures);
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2, {"--chunk_bytes=4096"}), fixtures);
  ASSERT_NE(server, nullptr);
  for (const EncodeCase& c :
       EncodeCases({"AutoencoderKL", "AutoencoderKLFlux2", "AutoencoderKLWan", "AutoencoderKLQwenImage",
                    "AutoencoderKLQwenImage21", "AutoencoderKLHunyuanImage", "AutoencoderKLHunyuanVideo",
                    "AutoencoderKLHunyuanVideo15", "AutoencoderKLLTX2Video", "AutoencoderKLMiniMaxH3"})) {
    const std::string what = c.fixture + "/" + c.name;
    // The mean, AUTO: exact over the group's two ranks (dense for a latent
    // of one row: no band would be empty); the image in 1 KiB pieces.
    v1::EncodeRequest mean = ImageRequest(c.fixture, c.image_file);
    mean.set_request_id("enc-" + c.name);
    const DecodeOutcome got_mean = Encode(server->stub(), mean, 1024);
    const FloatTensor want_mean = ReadFloat(c.mean_file, "mean");
    ExpectLatent(got_mean, want_mean, what + " mean");
    EXPECT_EQ(got_mean.output.header().request_id(), "enc-" + c.name);
    const bool shards = want_mean.shape[want_mean.shape.size() - 2] >= 2;
    EXPECT_EQ(got_mean.output.header().mode(), shards ? v1::MODE_EXACT : v1::MODE_DENSE) << what;
    EXPECT_EQ(got_mean.output.header().degree(), shards ? 2 : 1) << what;
    // The seeded sample, dense; the seed comes back.
    v1::EncodeRequest sample = ImageRequest(c.fixture, c.image_file);
    sample.set_posterior(v1::POSTERIOR_SAMPLE);
    sample.set_seed(static_cast<uint64_t>(c.sample_seed));
    sample.set_mode(v1::MODE_DENSE);
    const DecodeOutcome got_sample = Encode(server->stub(), sample);
    ExpectLatent(got_sample, ReadFloat(c.sample_file, "sample"), what + " sample");
    EXPECT_EQ(got_sample.output.header().sample_seed(), static_cast<uint64_t>(c.sample_seed));
    EXPECT_EQ(got_sample.output.header().mode(), v1::MODE_DENSE);
    // What the pipeline feeds its denoiser.
    if (!c.pipeline_encoded_file.empty()) {
      v1::EncodeRequest raw = c.pipeline_uses_sample ? sample : mean;
      raw.set_latent_space(v1::LATENT_SPACE_RAW);
      ExpectLatent(Encode(server->stub(), raw), ReadFloat(c.pipeline_encoded_file, "latent"), what + " raw");
    }
    // Moments: mean and log-variance on channels.
    v1::EncodeRequest moments = ImageRequest(c.fixture, c.image_file);
    moments.set_posterior(v1::POSTERIOR_MOMENTS);
    const DecodeOutcome got_moments = Encode(server->stub(), moments);
    ASSERT_TRUE(got_moments.status.ok()) << got_moments.status.error_message();
    const FloatTensor m = ReadFloat(c.mean_file, "mean"), lv = ReadFloat(c.logvar_file, "logvar");
    std::vector<int64_t> shape = m.shape;
    shape[1] *= 2;
    EXPECT_EQ(Shape(got_moments.output.header()), shape);
    // [B, 2C, (T,) h, w]: per batch entry, the mean's channels then the log-variance's.
    const std::vector<float> both = AsFloats(got_moments);
    const size_t per = m.data.size() / m.shape[0];
    std::vector<float> want;
    for (int64_t b = 0; b < m.shape[0]; ++b) {
      want.insert(want.end(), m.data.begin() + b * per, m.data.begin() + (b + 1) * per);
      want.insert(want.end(), lv.data.begin() + b * per, lv.data.begin() + (b + 1) * per);
    }
    EXPECT_LE(MaxAbsDiff(both, want), 1e-4) << what << " moments";
  }

  // A PNG, and the same pixels as UINT8: one encode.
  std::vector<uint8_t> pixels(40 * 24 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37) % 251);
  absl::StatusOr<std::string> png = formats::EncodePng(24, 40, 3, pixels.data());
  ASSERT_TRUE(png.ok());
  v1::EncodeRequest from_png;
  from_png.set_model("sd_kl");
  from_png.set_encoded_image(*png);
  const DecodeOutcome got_png = Encode(server->stub(), from_png, 100);
  ASSERT_TRUE(got_png.status.ok()) << got_png.status.error_message();
  EXPECT_EQ(Shape(got_png.output.header()), (std::vector<int64_t>{1, 4, 10, 6}));
  v1::EncodeRequest from_pixels;
  from_pixels.set_model("sd_kl");
  from_pixels.mutable_image()->set_dtype(v1::UINT8);
  for (int64_t d : {1, 40, 24, 3}) from_pixels.mutable_image()->add_shape(d);
  from_pixels.mutable_image()->set_data(std::string(pixels.begin(), pixels.end()));
  const DecodeOutcome got_pixels = Encode(server->stub(), from_pixels);
  ASSERT_TRUE(got_pixels.status.ok()) << got_pixels.status.error_message();
  EXPECT_EQ(AsFloats(got_pixels), AsFloats(got_png));

  // A video model encodes a still image as a one-frame clip.
  from_png.set_model("wan21");
  const DecodeOutcome got_frame = Encode(server->stub(), from_png, 100);
  ASSERT_TRUE(got_frame.status.ok()) << got_frame.status.error_message();
  EXPECT_EQ(Shape(got_frame.output.header()), (std::vector<int64_t>{1, 16, 1, 5, 3}));
}

TEST(EncodeServiceTest, BadRequestsAreRefusedClearlyAndTheServerKeepsServing) {
  const std::vector<std::string> fixtures = {"sd_kl", "ltx2"};
  const std::string repo = FixtureRepository(fixtures);
  auto server =
      StartServing(RealWorkerFlags(repo, "cpu:1", 1, {"--max_message_bytes=1048576", "--chunk_bytes=65536"}), fixtures);
  ASSERT_NE(server, nullptr);
  const v1::EncodeRequest good = ImageRequest("sd_kl", FixturePath("sd_kl/image.safetensors"));
  struct Bad {
    std::string what;
    v1::EncodeRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Bad> cases;
  auto with = [&](const std::string& what, grpc::StatusCode code, const std::string& message,
                  const std::function<void(v1::EncodeRequest&)>& mutate) {
    v1::EncodeRequest r = good;
    mutate(r);
    cases.push_back({what, r, code, message});
  };
  with("unknown model", grpc::StatusCode::NOT_FOUND, "sd_kl", [](auto& r) { r.set_model("nope"); });
  with("no image", grpc::StatusCode::INVALID_ARGUMENT, "one of image", [](auto& r) { r.clear_image(); });
  with("both images", grpc::StatusCode::INVALID_ARGUMENT, "one of image", [](auto& r) { r.set_encoded_image("x"); });
  with("tiled", grpc::StatusCode::INVALID_ARGUMENT, "not tiled", [](auto& r) { r.set_mode(v1::MODE_TILED); });
  with("exact on one rank", grpc::StatusCode::INVALID_ARGUMENT, "more than one rank",
       [](auto& r) { r.set_mode(v1::MODE_EXACT); });
  with("raw moments", grpc::StatusCode::INVALID_ARGUMENT, "VAE space only", [](auto& r) {
    r.set_posterior(v1::POSTERIOR_MOMENTS);
    r.set_latent_space(v1::LATENT_SPACE_RAW);
  });
  with("short data", grpc::StatusCode::INVALID_ARGUMENT, "image.data",
       [](auto& r) { r.mutable_image()->mutable_data()->resize(100); });
  with("image rank", grpc::StatusCode::INVALID_ARGUMENT, "image.shape", [](auto& r) {
    r.mutable_image()->clear_shape();
    for (int64_t d : {3, 68, 44}) r.mutable_image()->add_shape(d);
  });
  with("not a PNG", grpc::StatusCode::INVALID_ARGUMENT, "neither PNG, JPEG nor MP4", [](auto& r) {
    r.clear_image();
    r.set_encoded_image("GIF89a....");
  });
  with("channels", grpc::StatusCode::INVALID_ARGUMENT, "encodes 3", [](auto& r) {
    r.mutable_image()->set_shape(1, 1);
    r.mutable_image()->mutable_data()->resize(1 * 1 * 68 * 44 * 4);
  });
  with("a PNG header claiming 100000 x 100000 pixels", grpc::StatusCode::INVALID_ARGUMENT, "--max_output_pixels",
       [](auto& r) {
         r.clear_image();
         // Signature, IHDR length 13, "IHDR", width, height (big-endian), then nothing decodable.
         r.set_encoded_image(std::string("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\x01\x86\xa0\0\x01\x86\xa0\x08\x02", 26) +
                             std::string(64, '\0'));
       });
  with("a decoder-only checkpoint", grpc::StatusCode::FAILED_PRECONDITION, "cannot encode", [](auto& r) {
    r.set_model("ltx2");  // a video model: [B, C, T, H, W]
    r.mutable_image()->clear_shape();
    for (int64_t d : {1, 3, 1, 68, 44}) r.mutable_image()->add_shape(d);
  });
  with("too large", grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_message_bytes", [](auto& r) {
    r.mutable_image()->set_shape(2, 2720);  // 1.4 MB, in 16 KiB pieces
    r.mutable_image()->mutable_data()->resize(1 * 3 * 2720 * 44 * 4);
  });
  for (const Bad& b : cases) {
    const DecodeOutcome out = Encode(server->stub(), b.request, 16384);
    EXPECT_EQ(out.status.error_code(), b.code) << b.what << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(b.message)) << b.what;
    // The server still encodes after each refusal.
    const DecodeOutcome ok = Encode(server->stub(), good);
    EXPECT_TRUE(ok.status.ok()) << "after " << b.what << ": " << ok.status.error_message();
  }
  // Every call counted, by outcome.
  EXPECT_TRUE(server
                  ->WaitMetric("vaedecode_requests_total", {"model=\"sd_kl\"", "status=\"OK\""},
                               [&](double v) { return v >= static_cast<double>(cases.size()); })
                  .ok());
}

TEST(EncodeServiceTest, AnUploadThatStallsIsCutAtTheUploadTimeout) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1, {"--upload_timeout_s=2"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const v1::EncodeRequest good = ImageRequest("sd_kl", FixturePath("sd_kl/image.safetensors"));
  // The first piece only, then nothing: no half-close.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto stream = server->stub().Encode(&ctx);
  v1::EncodeRequest first = good;
  first.mutable_image()->mutable_data()->resize(1024);
  ASSERT_TRUE(stream->Write(first));
  const absl::Time start = absl::Now();
  v1::DecodeResponse message;
  while (stream->Read(&message)) {
  }
  const grpc::Status status = stream->Finish();
  // The server cancels the call (the client sees CANCELLED); its own log
  // line and metrics say DEADLINE_EXCEEDED, naming the flag.
  EXPECT_FALSE(status.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(
      server->WaitMetric("vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, [](double v) { return v >= 1; })
          .ok());
  // The server goes on encoding.
  const DecodeOutcome ok = Encode(server->stub(), good);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

}  // namespace
}  // namespace vaedecode::testing
