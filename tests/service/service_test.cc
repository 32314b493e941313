// The service end to end with the real worker: a vaedecode_server process on
// loopback, real vaedecode_worker processes (Gloo groups on CPU), the
// diffusers fixtures (../shared/fixtures) as the model repository, real
// /metrics scrapes checked by promtool, the real vaedecode_client binary.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client_io.h"
#include "formats/npy.h"
#include "formats/png.h"
#include "formats/safetensors.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kHealth[] = "vaedecode.v1.VaeDecoder/";

// A model repository of fixture folders (symlinks).
std::string Repository(const std::vector<std::string>& fixtures) {
  const std::string dir = TempDir("repo");
  for (const std::string& f : fixtures) {
    std::filesystem::create_directory_symlink(std::filesystem::absolute(FixturePath(f)),
                                              dir + "/" + f);
  }
  return dir;
}

std::vector<std::string> Flags(const std::string& repo, const std::string& devices, int group_size,
                               std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {
      absl::StrCat("--worker_binary=", Runfile("worker/vaedecode_worker")),
      absl::StrCat("--model_repository=", repo),
      absl::StrCat("--devices=", devices),
      absl::StrCat("--group_size=", group_size),
      "--collective_timeout_s=60",
  };
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

std::unique_ptr<ServerProcess> StartServing(const std::vector<std::string>& flags,
                                            const std::vector<std::string>& models) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(flags);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  for (const std::string& m : models) {
    absl::Status ok = (*s)->WaitServing(kHealth + m, true, absl::Seconds(120));
    EXPECT_TRUE(ok.ok()) << ok;
    if (!ok.ok()) return nullptr;
  }
  return *std::move(s);
}

struct FloatTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

FloatTensor ReadFloat(const std::string& path) {
  FloatTensor t;
  auto file = formats::SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return t;
  const formats::TensorView& v = (*file)->tensors()[0];
  EXPECT_EQ(v.dtype, formats::DType::kF32);
  t.shape = v.shape;
  t.data.resize(v.nbytes / 4);
  std::memcpy(t.data.data(), v.data, v.nbytes);
  return t;
}

v1::DecodeRequest Request(const std::string& model, const std::string& latent_file,
                          v1::OutputFormat format = v1::OUTPUT_FLOAT32,
                          v1::Mode mode = v1::MODE_AUTO) {
  v1::DecodeRequest r;
  r.set_model(model);
  absl::StatusOr<v1::Tensor> latent = client::ReadLatent(latent_file);
  EXPECT_TRUE(latent.ok()) << latent.status();
  if (latent.ok()) *r.mutable_latent() = *latent;
  r.set_output_format(format);
  r.set_mode(mode);
  return r;
}

// A FLOAT32 latent of `shape` (values in [-2, 2]) that takes a while to decode.
v1::DecodeRequest Synthetic(const std::string& model, std::vector<int64_t> shape,
                            const std::string& id = "") {
  v1::DecodeRequest r;
  r.set_model(model);
  r.set_request_id(id);
  *r.mutable_latent() = client::DemoLatent(shape, 7);
  return r;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    out = mant ? NAN : INFINITY;
  } else {
    out = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -out : out;
}

uint8_t ToPixel(float x) {
  float v = std::min(1.0f, std::max(0.0f, x / 2 + 0.5f)) * 255.0f;
  return static_cast<uint8_t>(std::nearbyint(v));
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

std::vector<float> AsFloats(const DecodeOutcome& out) {
  const std::string& bytes = out.output.tensor_bytes();
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::vector<int64_t> Shape(const v1::Header& h) { return {h.shape().begin(), h.shape().end()}; }

void ExpectOk(const DecodeOutcome& out) {
  ASSERT_TRUE(out.status.ok()) << out.status.error_code() << " " << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << out.stream_error;
  ASSERT_TRUE(out.output.Finish().ok()) << out.output.Finish();
}

// Compares a decode in `format` with the diffusers reference `expected` (NCHW
// or NCTHW float32): float32 to 1e-4, float16 to its rounding, uint8/PNG to
// one level of the 8-bit conversion.
void ExpectMatches(const DecodeOutcome& out, const FloatTensor& expected, v1::OutputFormat format) {
  ExpectOk(out);
  const bool video = expected.shape.size() == 5;
  const int64_t B = expected.shape[0], C = expected.shape[1];
  const int64_t T = video ? expected.shape[2] : 1;
  const int64_t H = expected.shape[video ? 3 : 2], W = expected.shape[video ? 4 : 3];
  const v1::Header& h = out.output.header();
  EXPECT_EQ(h.output_format(), format);
  if (format == v1::OUTPUT_FLOAT32) {
    EXPECT_EQ(Shape(h), expected.shape);
    EXPECT_LE(MaxAbsDiff(AsFloats(out), expected.data), 1e-4);
    return;
  }
  if (format == v1::OUTPUT_FLOAT16) {
    EXPECT_EQ(Shape(h), expected.shape);
    const std::string& bytes = out.output.tensor_bytes();
    ASSERT_EQ(bytes.size(), expected.data.size() * 2);
    double worst = 0;
    for (size_t i = 0; i < expected.data.size(); ++i) {
      uint16_t half;
      std::memcpy(&half, bytes.data() + 2 * i, 2);
      const double err = std::fabs(HalfToFloat(half) - expected.data[i]);
      worst = std::max(worst, err - 1e-3 * std::fabs(expected.data[i]));
    }
    EXPECT_LE(worst, 1e-4);
    return;
  }
  // uint8 images [B, (T,) H, W, C], from the reference.
  std::vector<int64_t> want_shape = {B};
  if (video) want_shape.push_back(T);
  want_shape.insert(want_shape.end(), {H, W, C});
  EXPECT_EQ(Shape(h), want_shape);
  std::vector<uint8_t> pixels(B * T * H * W * C);
  if (format == v1::OUTPUT_UINT8) {
    ASSERT_EQ(out.output.tensor_bytes().size(), pixels.size());
    std::memcpy(pixels.data(), out.output.tensor_bytes().data(), pixels.size());
  } else {
    ASSERT_EQ(out.output.pngs().size(), static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) {
      absl::StatusOr<formats::PngImage> png = formats::DecodePng(out.output.pngs()[i]);
      ASSERT_TRUE(png.ok()) << png.status();
      ASSERT_EQ(png->width, W);
      ASSERT_EQ(png->height, H);
      ASSERT_EQ(png->channels, C);
      std::memcpy(pixels.data() + i * H * W * C, png->pixels.data(), H * W * C);
    }
  }
  int worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          for (int64_t c = 0; c < C; ++c) {
            const float e = expected.data[(((b * C + c) * T + t) * H + y) * W + x];
            const int got = pixels[(((b * T + t) * H + y) * W + x) * C + c];
            worst = std::max(worst, std::abs(got - ToPixel(e)));
          }
  EXPECT_LE(worst, 1);
}

// Waits until /metrics shows `name{labels}` == value.
void WaitMetric(ServerProcess& server, const std::string& name,
                const std::vector<std::string>& labels, double value) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  double last = -2;
  while (absl::Now() < give_up) {
    absl::StatusOr<std::string> m = server.ScrapeMetrics();
    if (m.ok() && (last = MetricValue(*m, name, labels)) == value) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << name << " never became " << value << " (last " << last << ")";
}

TEST(ServiceTest, EveryOutputFormatEqualsDiffusersAndErrorsAreClear) {
  const std::string repo = Repository({"sd_kl", "flux1_kl"});
  auto server = StartServing(Flags(repo, "cpu:2", 2), {"sd_kl", "flux1_kl"});
  ASSERT_NE(server, nullptr);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sd_kl", "sd_kl/latent.safetensors"},
      {"sd_kl", "sd_kl/latent_b2.safetensors"},
      {"flux1_kl", "flux1_kl/latent.safetensors"},
  };
  const std::vector<std::string> expected_files = {"sd_kl/expected.safetensors",
                                                   "sd_kl/expected_b2.safetensors",
                                                   "flux1_kl/expected.safetensors"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const FloatTensor expected = ReadFloat(FixturePath(expected_files[i]));
    for (v1::OutputFormat format :
         {v1::OUTPUT_FLOAT32, v1::OUTPUT_FLOAT16, v1::OUTPUT_UINT8, v1::OUTPUT_PNG}) {
      SCOPED_TRACE(absl::StrCat(cases[i].second, " ", v1::OutputFormat_Name(format)));
      const DecodeOutcome out =
          Decode(server->stub(), Request(cases[i].first, FixturePath(cases[i].second), format));
      ExpectMatches(out, expected, format);
      EXPECT_EQ(out.output.header().mode(), v1::MODE_EXACT);
      EXPECT_EQ(out.output.header().degree(), 2);
      EXPECT_GT(out.output.trailer().collectives(), 0);
      EXPECT_GT(out.output.trailer().timings().decode_ms(), 0);
      EXPECT_GE(out.output.trailer().timings().total_ms(),
                out.output.trailer().timings().decode_ms());
    }
  }
  // Raw (denoiser-space) latents get the family's de-normalisation.
  v1::DecodeRequest raw = Request("sd_kl", FixturePath("sd_kl/pipeline_latent.safetensors"));
  raw.set_latent_space(v1::LATENT_SPACE_RAW);
  ExpectMatches(Decode(server->stub(), raw), ReadFloat(FixturePath("sd_kl/expected.safetensors")),
                v1::OUTPUT_FLOAT32);

  // Bad input: the code and a message naming the problem; the server keeps serving.
  struct Case {
    std::function<void(v1::DecodeRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> bad = {
      {[](auto& r) { r.set_model("sd_xl"); }, grpc::StatusCode::NOT_FOUND, "flux1_kl, sd_kl"},
      {[](auto& r) { r.mutable_latent()->set_shape(1, 16); }, grpc::StatusCode::INVALID_ARGUMENT,
       "takes 4 latent channels, got 16"},
      {[](auto& r) { r.mutable_latent()->add_shape(1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "rank 4"},
      {[](auto& r) { r.mutable_latent()->set_dtype(v1::UINT8); },
       grpc::StatusCode::INVALID_ARGUMENT, "not a floating type"},
      {[](auto& r) { r.mutable_latent()->mutable_data()->resize(100); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent.data: 100 bytes"},
      {[](auto& r) { r.set_mode(v1::MODE_TILED); }, grpc::StatusCode::UNIMPLEMENTED, "TILED"},
      {[](auto& r) { r.clear_latent(); }, grpc::StatusCode::INVALID_ARGUMENT, "latent: missing"},
  };
  for (const Case& c : bad) {
    v1::DecodeRequest r = Request("sd_kl", FixturePath("sd_kl/latent.safetensors"));
    c.mutate(r);
    const DecodeOutcome out = Decode(server->stub(), r);
    EXPECT_EQ(out.status.error_code(), c.code) << c.message << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message));
  }
  ExpectMatches(Decode(server->stub(), Request("sd_kl", FixturePath("sd_kl/latent.safetensors"))),
                ReadFloat(FixturePath("sd_kl/expected.safetensors")), v1::OUTPUT_FLOAT32);

  // Metrics: scraped over HTTP, valid for promtool, with the decodes counted.
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::string> check = PromtoolCheck(*m);
  EXPECT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {"model=\"sd_kl\"", "status=\"OK\""}), 10);
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total",
                        {"model=\"sd_kl\"", "status=\"INVALID_ARGUMENT\""}),
            5);
  EXPECT_EQ(MetricValue(*m, "vaedecode_decode_seconds_count",
                        {"family=\"autoencoder_kl\"", "mode=\"EXACT\"", "degree=\"2\""}),
            14);
  EXPECT_GT(MetricValue(*m, "vaedecode_collectives_per_decode_sum", {"mode=\"EXACT\""}), 14);
  EXPECT_GT(MetricValue(*m, "vaedecode_device_peak_bytes", {"device=\"cpu:1\""}), 0);
  absl::StatusOr<std::vector<std::string>> services = server->ReflectionServices();
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services, ::testing::Contains("vaedecode.v1.VaeDecoder"));
}

TEST(ServiceTest, VideoModelStreamsFrames) {
  const std::string repo = Repository({"wan21"});
  auto server = StartServing(Flags(repo, "cpu:2", 2), {"wan21"});
  ASSERT_NE(server, nullptr);
  const FloatTensor expected = ReadFloat(FixturePath("wan21/expected.safetensors"));
  for (v1::OutputFormat format : {v1::OUTPUT_FLOAT32, v1::OUTPUT_PNG}) {
    SCOPED_TRACE(v1::OutputFormat_Name(format));
    ExpectMatches(
        Decode(server->stub(), Request("wan21", FixturePath("wan21/latent.safetensors"), format)),
        expected, format);
  }
}

TEST(ServiceTest, ExactOnGroupsOfTwoAndThreeEqualsDense) {
  const std::string repo = Repository({"sd_kl", "flux1_kl"});
  for (int g : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("group size ", g));
    auto server = StartServing(Flags(repo, absl::StrCat("cpu:", g), g), {"sd_kl", "flux1_kl"});
    ASSERT_NE(server, nullptr);
    for (const auto& [model, latent] : std::vector<std::pair<std::string, std::string>>{
             {"sd_kl", "sd_kl/latent.safetensors"}, {"flux1_kl", "flux1_kl/latent.safetensors"}}) {
      const DecodeOutcome exact = Decode(
          server->stub(), Request(model, FixturePath(latent), v1::OUTPUT_FLOAT32, v1::MODE_EXACT));
      const DecodeOutcome dense = Decode(
          server->stub(), Request(model, FixturePath(latent), v1::OUTPUT_FLOAT32, v1::MODE_DENSE));
      ExpectOk(exact);
      ExpectOk(dense);
      EXPECT_EQ(exact.output.header().mode(), v1::MODE_EXACT);
      EXPECT_EQ(exact.output.header().degree(), g);
      EXPECT_EQ(dense.output.header().mode(), v1::MODE_DENSE);
      EXPECT_EQ(dense.output.header().degree(), 1);
      EXPECT_EQ(exact.output.trailer().peak_bytes_per_rank_size(), g);
      EXPECT_LE(MaxAbsDiff(AsFloats(exact), AsFloats(dense)), 1e-4);
    }
  }
}

TEST(ServiceTest, ConcurrentClientsAndTheClientBinary) {
  const std::string repo = Repository({"sd_kl", "flux1_kl"});
  auto server = StartServing(Flags(repo, "cpu:4", 2), {"sd_kl", "flux1_kl"});
  ASSERT_NE(server, nullptr);
  const std::vector<std::array<std::string, 3>> cases = {
      {"sd_kl", "sd_kl/latent.safetensors", "sd_kl/expected.safetensors"},
      {"sd_kl", "sd_kl/latent_b2.safetensors", "sd_kl/expected_b2.safetensors"},
      {"flux1_kl", "flux1_kl/latent.safetensors", "flux1_kl/expected.safetensors"},
  };
  constexpr int kThreads = 4, kEach = 3;
  std::vector<std::vector<DecodeOutcome>> outcomes(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const auto& c = cases[(t + i) % cases.size()];
        outcomes[t].push_back(Decode(server->stub(), Request(c[0], FixturePath(c[1]))));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kEach; ++i)
      ExpectMatches(outcomes[t][i], ReadFloat(FixturePath(cases[(t + i) % cases.size()][2])),
                    v1::OUTPUT_FLOAT32);

  // The client binary, like the CLI: .npy and .png outputs.
  const std::string out = TempDir("client");
  for (const std::string& file : {std::string("sample.npy"), std::string("b2.png")}) {
    const bool png = file == "b2.png";
    const std::string cmd = absl::StrCat(
        Runfile("client/vaedecode_client"), " --server=", server->address(), " --model=sd_kl",
        " --latent=", FixturePath(png ? "sd_kl/latent_b2.safetensors" : "sd_kl/latent.safetensors"),
        " --out=", out, "/", file, " 2>&1");
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    std::string text;
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << text;
    EXPECT_THAT(text, HasSubstr("mode=MODE_EXACT degree=2"));
  }
  absl::StatusOr<formats::NpyArray> npy = formats::ReadNpy(out + "/sample.npy");
  ASSERT_TRUE(npy.ok()) << npy.status();
  std::vector<float> got(npy->data.size() / 4);
  std::memcpy(got.data(), npy->data.data(), npy->data.size());
  const FloatTensor expected = ReadFloat(FixturePath("sd_kl/expected.safetensors"));
  EXPECT_EQ(npy->shape, expected.shape);
  EXPECT_LE(MaxAbsDiff(got, expected.data), 1e-4);
  EXPECT_TRUE(std::filesystem::exists(out + "/b2_0.png"));
  EXPECT_TRUE(std::filesystem::exists(out + "/b2_1.png"));
  EXPECT_FALSE(std::filesystem::exists(out + "/b2.png"));
}

// A decode of about a second or more on one CPU rank: [N, 4, 64, 64] on sd_kl.
v1::DecodeRequest Slow(int batch, const std::string& id) {
  return Synthetic("sd_kl", {batch, 4, 64, 64}, id);
}

TEST(ServiceTest, QueueFullDeadlineAndCancellation) {
  const std::string repo = Repository({"sd_kl"});
  auto server =
      StartServing(Flags(repo, "cpu:1", 1, {"--max_queue=1", "--chunk_bytes=65536"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest small = Request("sd_kl", FixturePath("sd_kl/latent.safetensors"));
  const FloatTensor expected = ReadFloat(FixturePath("sd_kl/expected.safetensors"));

  // Queue full: one running, one queued, the third refused at once.
  DecodeOutcome running, queued;
  std::thread a([&] { running = Decode(server->stub(), Slow(4, "running")); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  std::thread b([&] { queued = Decode(server->stub(), small); });
  WaitMetric(*server, "vaedecode_queue_depth", {}, 1);
  absl::Time t0 = absl::Now();
  DecodeOutcome refused = Decode(server->stub(), small);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("queue is full"));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
  a.join();
  b.join();
  ExpectOk(running);
  ExpectMatches(queued, expected, v1::OUTPUT_FLOAT32);
  // A batch-16 decode takes about four times this one.
  const absl::Duration batch4 = absl::Milliseconds(running.output.trailer().timings().decode_ms());

  // Deadline exceeded while queued behind a slow decode.
  std::thread c([&] { running = Decode(server->stub(), Slow(4, "running-2")); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  t0 = absl::Now();
  const DecodeOutcome late = Decode(server->stub(), small, absl::Milliseconds(300));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  WaitMetric(*server, "vaedecode_queue_depth", {}, 0);
  c.join();
  ExpectOk(running);
  WaitMetric(*server, "vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, 1);

  // Cancellation during the decode stops the work on the group: the next
  // request does not wait for the rest of a long decode.
  absl::Mutex mu;
  grpc::ClientContext* call = nullptr;
  DecodeOutcome cancelled;
  std::thread d([&] {
    cancelled = Decode(server->stub(), Slow(16, "to-cancel"), absl::Seconds(60), nullptr,
                       [&](grpc::ClientContext& ctx) {
                         absl::MutexLock lock(&mu);
                         call = &ctx;
                       });
  });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  absl::SleepFor(absl::Milliseconds(300));
  {
    absl::MutexLock lock(&mu);
    ASSERT_NE(call, nullptr);
    call->TryCancel();
  }
  t0 = absl::Now();
  d.join();
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  ExpectMatches(Decode(server->stub(), small), expected, v1::OUTPUT_FLOAT32);
  // Without the cancellation the small decode would wait for the rest of the
  // batch-16 one (~4 × batch4 - 0.3 s); the leader stops at its next check.
  EXPECT_LT(absl::Now() - t0, 0.75 * 4 * batch4);

  // Cancellation mid-stream (small chunks: many messages).
  const DecodeOutcome mid = Decode(server->stub(), Slow(2, "mid-stream"), absl::Seconds(60),
                                   [](int n, grpc::ClientContext& ctx) {
                                     if (n == 2) ctx.TryCancel();
                                   });
  EXPECT_EQ(mid.status.error_code(), grpc::StatusCode::CANCELLED);
  WaitMetric(*server, "vaedecode_requests_total", {"status=\"CANCELLED\""}, 2);
  WaitMetric(*server, "vaedecode_in_flight", {}, 0);
  ExpectMatches(Decode(server->stub(), small), expected, v1::OUTPUT_FLOAT32);
}

TEST(ServiceTest, KilledWorkerFailsOnlyItsRequestThenTheGroupIsRebuilt) {
  const std::string repo = Repository({"sd_kl"});
  auto server = StartServing(Flags(repo, "cpu:2", 2), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::vector<WorkerProcess>> workers = server->WaitWorkers(2, absl::Seconds(10));
  ASSERT_TRUE(workers.ok()) << workers.status();
  pid_t peer = 0;
  std::string incarnation;
  for (const auto& w : *workers) {
    if (w.rank == 1) peer = w.pid;
    incarnation = w.group;
  }
  ASSERT_GT(peer, 0);
  DecodeOutcome killed;
  std::thread a([&] { killed = Decode(server->stub(), Slow(8, "victim"), absl::Seconds(120)); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(kill(peer, SIGKILL), 0);
  a.join();
  EXPECT_EQ(killed.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(killed.status.error_message(), HasSubstr("rank 1"));
  EXPECT_THAT(killed.status.error_message(), HasSubstr("signal 9"));
  // The model's health went NOT_SERVING and comes back once rebuilt.
  EXPECT_EQ(server->Serving(std::string(kHealth) + "sd_kl").value_or(true), false);
  ASSERT_TRUE(server->WaitServing(std::string(kHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  EXPECT_TRUE(server->WaitWorkers(2, absl::Seconds(10), incarnation).ok());
  ExpectMatches(Decode(server->stub(), Request("sd_kl", FixturePath("sd_kl/latent.safetensors"))),
                ReadFloat(FixturePath("sd_kl/expected.safetensors")), v1::OUTPUT_FLOAT32);
  WaitMetric(*server, "vaedecode_worker_restarts_total", {"group=\"g0\""}, 1);
}

TEST(ServiceTest, SigtermDrainsInFlightThenExitsZero) {
  const std::string repo = Repository({"sd_kl"});
  auto server = StartServing(Flags(repo, "cpu:1", 1, {"--drain_timeout_s=60"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  DecodeOutcome running;
  std::thread a([&] { running = Decode(server->stub(), Slow(4, "draining")); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  server->Signal(SIGTERM);
  EXPECT_TRUE(server->WaitServing("", false, absl::Seconds(5)).ok());
  EXPECT_EQ(server->Serving(std::string(kHealth) + "sd_kl").value_or(true), false);
  const DecodeOutcome refused =
      Decode(server->stub(), Request("sd_kl", FixturePath("sd_kl/latent.safetensors")));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  a.join();
  ExpectOk(running);
  absl::StatusOr<int> code = server->WaitExit(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(server->Workers().empty());
}

}  // namespace
}  // namespace vaedecode::testing
