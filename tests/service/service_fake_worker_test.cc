// The server's scheduling, supervision, drain and error paths against the
// torch-free fake worker (tests/service/fake_worker.cc): real server process,
// real worker processes, real gRPC on loopback, real /metrics scrapes.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kFactor = 8;  // the fake's spatial factor

std::string ModelRepository() {
  static const std::string dir = [] {
    const std::string d = TempDir("models");
    std::filesystem::create_directories(d + "/alpha");
    std::filesystem::create_directories(d + "/beta");
    return d;
  }();
  return dir;
}

std::vector<std::string> Flags(const std::string& devices, int group_size,
                               std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {
      absl::StrCat("--worker_binary=", Runfile("tests/service/fake_worker")),
      absl::StrCat("--model_repository=", ModelRepository()),
      absl::StrCat("--devices=", devices),
      absl::StrCat("--group_size=", group_size),
      "--chunk_bytes=1024",
  };
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

v1::DecodeRequest Request(std::vector<int64_t> shape, const std::string& id = "",
                          float offset = 0) {
  v1::DecodeRequest r;
  r.set_model("alpha");
  r.set_request_id(id);
  v1::Tensor* t = r.mutable_latent();
  t->set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t->add_shape(d);
    n *= d;
  }
  std::string data(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = offset + 0.25f * static_cast<float>(i);
    std::memcpy(data.data() + i * 4, &v, 4);
  }
  t->set_data(std::move(data));
  return r;
}

// The fake's output: channels 0..2 of the latent, nearest-upsampled.
void ExpectFakeOutput(const v1::DecodeRequest& request, const DecodeOutcome& out) {
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << out.stream_error;
  ASSERT_TRUE(out.output.Finish().ok()) << out.output.Finish();
  const auto& s = request.latent().shape();
  const int64_t B = s[0], C = s[1], h = s[2], w = s[3], H = h * kFactor, W = w * kFactor;
  ASSERT_THAT(
      std::vector<int64_t>(out.output.header().shape().begin(), out.output.header().shape().end()),
      ::testing::ElementsAre(B, 3, H, W));
  const float* in = reinterpret_cast<const float*>(request.latent().data().data());
  const float* got = reinterpret_cast<const float*>(out.output.tensor_bytes().data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          ASSERT_EQ(got[((b * 3 + c) * H + y) * W + x],
                    in[((b * C + c) * h + y / kFactor) * w + x / kFactor])
              << b << " " << c << " " << y << " " << x;
}

std::unique_ptr<ServerProcess> StartServing(const std::vector<std::string>& flags,
                                            const std::string& model = "alpha") {
  absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(flags);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*s)->WaitServing("vaedecode.v1.VaeDecoder/" + model, true, absl::Seconds(30)).ok());
  return *std::move(s);
}

// Waits until the server's /metrics shows `name{labels}` == value.
void WaitMetric(ServerProcess& server, const std::string& name,
                const std::vector<std::string>& labels, double value) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  double last = -2;
  while (absl::Now() < give_up) {
    absl::StatusOr<std::string> m = server.ScrapeMetrics();
    if (m.ok() && (last = MetricValue(*m, name, labels)) == value) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << name << " never became " << value << " (last " << last << ")";
}

TEST(FakeWorkerServiceTest, DecodeModelsHealthReflection) {
  auto server = StartServing(Flags("cpu:2", 2));
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest request = Request({2, 4, 3, 5}, "first");
  DecodeOutcome out = Decode(server->stub(), request);
  ExpectFakeOutput(request, out);
  const v1::Header& h = out.output.header();
  EXPECT_EQ(h.request_id(), "first");
  EXPECT_EQ(h.mode(), v1::MODE_EXACT);
  EXPECT_EQ(h.degree(), 2);
  EXPECT_GT(out.output.chunks(), 2);  // --chunk_bytes=1024 splits every image
  const v1::Trailer& t = out.output.trailer();
  EXPECT_EQ(t.collectives(), 7);
  EXPECT_GE(t.timings().queue_ms(), 0);
  EXPECT_GT(t.timings().total_ms(), 0);
  EXPECT_EQ(t.timings().decode_ms(), 1.0);

  // A generated request id when none is given; dense on request.
  v1::DecodeRequest dense = Request({1, 4, 2, 2});
  dense.set_mode(v1::MODE_DENSE);
  out = Decode(server->stub(), dense);
  ExpectFakeOutput(dense, out);
  EXPECT_EQ(out.output.header().mode(), v1::MODE_DENSE);
  EXPECT_EQ(out.output.header().request_id().size(), 16u);

  grpc::ClientContext ctx;
  v1::ListModelsResponse models;
  ASSERT_TRUE(server->stub().ListModels(&ctx, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 2);
  EXPECT_EQ(models.models(0).name(), "alpha");
  EXPECT_EQ(models.models(1).name(), "beta");
  grpc::ClientContext ctx2;
  v1::GetModelRequest get;
  get.set_name("nope");
  v1::ModelInfo info;
  const grpc::Status missing = server->stub().GetModel(&ctx2, get, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("alpha, beta"));

  EXPECT_EQ(server->Serving("").value_or(false), true);
  EXPECT_EQ(server->Serving("vaedecode.v1.VaeDecoder").value_or(false), true);
  EXPECT_EQ(server->Serving("vaedecode.v1.VaeDecoder/beta").value_or(false), true);
  EXPECT_EQ(server->Serving("vaedecode.v1.VaeDecoder/nope").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> services = server->ReflectionServices();
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services, ::testing::Contains("vaedecode.v1.VaeDecoder"));
  EXPECT_THAT(*services, ::testing::Contains("grpc.health.v1.Health"));
}

TEST(FakeWorkerServiceTest, BadInputsGetClearErrorsAndTheServerKeepsServing) {
  auto server = StartServing(Flags("cpu:1", 1, {"--max_message_bytes=8388608"}));
  ASSERT_NE(server, nullptr);
  struct Case {
    std::string name;
    std::function<void(v1::DecodeRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"empty model", [](auto& r) { r.set_model(""); }, grpc::StatusCode::INVALID_ARGUMENT,
       "model: empty"},
      {"unknown model", [](auto& r) { r.set_model("gamma"); }, grpc::StatusCode::NOT_FOUND,
       "model \"gamma\" not found"},
      {"no latent", [](auto& r) { r.clear_latent(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "latent: missing"},
      {"no dtype", [](auto& r) { r.mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent.dtype: unspecified"},
      {"uint8 latent", [](auto& r) { r.mutable_latent()->set_dtype(v1::UINT8); },
       grpc::StatusCode::INVALID_ARGUMENT, "UINT8 is not a floating type"},
      {"rank 3", [](auto& r) { r.mutable_latent()->mutable_shape()->RemoveLast(); },
       grpc::StatusCode::INVALID_ARGUMENT, "rank 4"},
      {"video latent for an image model", [](auto& r) { r.mutable_latent()->add_shape(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "got rank 5"},
      {"zero dim", [](auto& r) { r.mutable_latent()->set_shape(2, 0); },
       grpc::StatusCode::INVALID_ARGUMENT, "dimension 2 is 0"},
      {"negative dim", [](auto& r) { r.mutable_latent()->set_shape(3, -4); },
       grpc::StatusCode::INVALID_ARGUMENT, "dimension 3 is -4"},
      {"channels", [](auto& r) { r.mutable_latent()->set_shape(1, 16); },
       grpc::StatusCode::INVALID_ARGUMENT, "takes 4 latent channels, got 16"},
      {"short data", [](auto& r) { r.mutable_latent()->mutable_data()->resize(10); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent.data: 10 bytes"},
      {"fp16 byte count", [](auto& r) { r.mutable_latent()->set_dtype(v1::FLOAT16); },
       grpc::StatusCode::INVALID_ARGUMENT, "FLOAT16 needs"},
      {"huge shape", [](auto& r) { r.mutable_latent()->set_shape(0, int64_t{1} << 40); },
       grpc::StatusCode::INVALID_ARGUMENT, "more than 2^40 elements"},
      {"mode enum", [](auto& r) { r.set_mode(static_cast<v1::Mode>(42)); },
       grpc::StatusCode::INVALID_ARGUMENT, "mode: unknown value 42"},
      {"format enum", [](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(9)); },
       grpc::StatusCode::INVALID_ARGUMENT, "output_format: unknown value 9"},
      {"space enum", [](auto& r) { r.set_latent_space(static_cast<v1::LatentSpace>(5)); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent_space: unknown value 5"},
      {"exact on one rank", [](auto& r) { r.set_mode(v1::MODE_EXACT); },
       grpc::StatusCode::INVALID_ARGUMENT, "EXACT needs a worker group of at least 2 ranks"},
      {"tiled", [](auto& r) { r.set_mode(v1::MODE_TILED); }, grpc::StatusCode::UNIMPLEMENTED,
       "TILED is not implemented"},
      {"long request id", [](auto& r) { r.set_request_id(std::string(300, 'x')); },
       grpc::StatusCode::INVALID_ARGUMENT, "request_id: 300 characters"},
      // Checked by the leader, not the frontend: the fake takes FLOAT32 output only.
      {"leader refuses", [](auto& r) { r.set_output_format(v1::OUTPUT_PNG); },
       grpc::StatusCode::UNIMPLEMENTED, "fake: OUTPUT_FLOAT32 only"},
  };
  for (const Case& c : cases) {
    v1::DecodeRequest r = Request({1, 4, 2, 3});
    c.mutate(r);
    const DecodeOutcome out = Decode(server->stub(), r);
    EXPECT_EQ(out.status.error_code(), c.code) << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // Larger than --max_message_bytes: refused by gRPC itself.
  v1::DecodeRequest big = Request({1, 4, 1024, 1100});
  EXPECT_EQ(Decode(server->stub(), big).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  const v1::DecodeRequest good = Request({1, 4, 2, 3}, "after-errors");
  ExpectFakeOutput(good, Decode(server->stub(), good));
  absl::StatusOr<std::string> metrics = server->ScrapeMetrics();
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(MetricValue(*metrics, "vaedecode_requests_total",
                        {"model=\"_unknown\"", "status=\"NOT_FOUND\""}),
            1);
  EXPECT_EQ(MetricValue(*metrics, "vaedecode_requests_total", {"model=\"alpha\"", "status=\"OK\""}),
            1);
}

TEST(FakeWorkerServiceTest, FullQueueIsResourceExhaustedAtOnce) {
  auto server = StartServing(Flags("cpu:1", 1, {"--max_queue=1"}));
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest slow = Request({1, 4, 4, 4}, "running-sleep=100");
  DecodeOutcome running, queued;
  std::thread a([&] { running = Decode(server->stub(), slow); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  const v1::DecodeRequest second = Request({1, 4, 4, 4}, "queued-sleep=10");
  std::thread b([&] { queued = Decode(server->stub(), second); });
  WaitMetric(*server, "vaedecode_queue_depth", {}, 1);
  const absl::Time t0 = absl::Now();
  const DecodeOutcome refused = Decode(server->stub(), Request({1, 4, 2, 2}));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("queue is full"));
  a.join();
  b.join();
  ExpectFakeOutput(slow, running);
  ExpectFakeOutput(second, queued);
  EXPECT_GT(queued.output.trailer().timings().queue_ms(), 100);
}

TEST(FakeWorkerServiceTest, DeadlineWhileQueued) {
  auto server = StartServing(Flags("cpu:1", 1));
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest slow = Request({1, 4, 4, 4}, "sleep=80");
  DecodeOutcome running;
  std::thread a([&] { running = Decode(server->stub(), slow); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  const absl::Time t0 = absl::Now();
  const DecodeOutcome late = Decode(server->stub(), Request({1, 4, 2, 2}), absl::Milliseconds(300));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  WaitMetric(*server, "vaedecode_queue_depth", {}, 0);
  a.join();
  ExpectFakeOutput(slow, running);
  WaitMetric(*server, "vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, 1);
}

TEST(FakeWorkerServiceTest, DeadlineBetweenChunks) {
  auto server = StartServing(Flags("cpu:1", 1));
  ASSERT_NE(server, nullptr);
  const DecodeOutcome out =
      Decode(server->stub(), Request({1, 4, 4, 4}, "sleep=100"), absl::Milliseconds(450));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GT(out.messages, 1);  // it was streaming
  // The leader stopped: the next decode does not wait for the rest of the first.
  const absl::Time t0 = absl::Now();
  const v1::DecodeRequest next = Request({1, 4, 2, 2});
  ExpectFakeOutput(next, Decode(server->stub(), next));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(900));
}

TEST(FakeWorkerServiceTest, CancellationMidStreamStopsTheGroup) {
  auto server = StartServing(Flags("cpu:2", 2));
  ASSERT_NE(server, nullptr);
  const DecodeOutcome out = Decode(server->stub(), Request({1, 4, 4, 4}, "sleep=150"),
                                   absl::Seconds(30), [](int n, grpc::ClientContext& ctx) {
                                     if (n == 3) ctx.TryCancel();
                                   });
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::CANCELLED);
  const absl::Time t0 = absl::Now();
  const v1::DecodeRequest next = Request({1, 4, 2, 2});
  ExpectFakeOutput(next, Decode(server->stub(), next));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(1000));  // the rest would take ~2 s
  WaitMetric(*server, "vaedecode_requests_total", {"status=\"CANCELLED\""}, 1);
  WaitMetric(*server, "vaedecode_in_flight", {}, 0);
}

TEST(FakeWorkerServiceTest, KilledWorkerFailsOnlyItsRequestAndTheGroupIsRebuilt) {
  setenv("FAKE_WORKER_START_DELAY_MS", "800", 1);
  auto server = StartServing(Flags("cpu:2", 2));
  unsetenv("FAKE_WORKER_START_DELAY_MS");
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::vector<WorkerProcess>> workers = server->WaitWorkers(2, absl::Seconds(5));
  ASSERT_TRUE(workers.ok());
  pid_t peer = 0;
  std::string incarnation;
  for (const auto& w : *workers) {
    if (w.rank == 1) peer = w.pid;
    incarnation = w.group;
  }
  ASSERT_GT(peer, 0);
  setenv("FAKE_WORKER_START_DELAY_MS", "800", 1);  // the rebuilt group too
  const DecodeOutcome out = Decode(server->stub(), Request({1, 4, 4, 4}, "sleep=100"),
                                   absl::Seconds(30), [peer](int n, grpc::ClientContext&) {
                                     if (n == 2) kill(peer, SIGKILL);
                                   });
  unsetenv("FAKE_WORKER_START_DELAY_MS");
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr("rank 1"));
  EXPECT_THAT(out.status.error_message(), HasSubstr("signal 9"));
  EXPECT_TRUE(server->WaitServing("vaedecode.v1.VaeDecoder/alpha", false, absl::Seconds(2)).ok());
  EXPECT_TRUE(server->WaitServing("vaedecode.v1.VaeDecoder/alpha", true, absl::Seconds(20)).ok());
  EXPECT_TRUE(server->WaitWorkers(2, absl::Seconds(5), incarnation).ok());
  const v1::DecodeRequest next = Request({1, 4, 3, 3});
  ExpectFakeOutput(next, Decode(server->stub(), next));
  WaitMetric(*server, "vaedecode_worker_restarts_total", {"group=\"g0\""}, 1);
  WaitMetric(*server, "vaedecode_requests_total", {"status=\"UNAVAILABLE\""}, 1);
}

TEST(FakeWorkerServiceTest, LeaderCrashIsUnavailableNamingTheLeader) {
  auto server = StartServing(Flags("cpu:1", 1));
  ASSERT_NE(server, nullptr);
  const DecodeOutcome out = Decode(server->stub(), Request({1, 4, 4, 4}, "crash"));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr("rank 0"));
  EXPECT_THAT(out.status.error_message(), HasSubstr("exited with code 3"));
  // A request sent during the rebuild waits in the queue and succeeds.
  const v1::DecodeRequest next = Request({1, 4, 2, 2});
  ExpectFakeOutput(next, Decode(server->stub(), next));
}

TEST(FakeWorkerServiceTest, QueuedRequestsSurviveAGroupFailure) {
  auto server = StartServing(Flags("cpu:1", 1));
  ASSERT_NE(server, nullptr);
  DecodeOutcome crashed, queued;
  std::thread a([&] {
    crashed = Decode(server->stub(), Request({1, 4, 4, 4}, "sleep=100-crash"));
  });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  const v1::DecodeRequest second = Request({1, 4, 2, 2}, "queued");
  std::thread b([&] { queued = Decode(server->stub(), second); });
  a.join();
  b.join();
  EXPECT_EQ(crashed.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ExpectFakeOutput(second, queued);
}

TEST(FakeWorkerServiceTest, FailedStartsKeepRetryingAndHealthSaysNotServing) {
  const std::string fail_file = TempDir("fail") + "/fail";
  { std::ofstream touch(fail_file); }
  setenv("FAKE_WORKER_FAIL_START_FILE", fail_file.c_str(), 1);
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(Flags("cpu:1", 1));
  unsetenv("FAKE_WORKER_FAIL_START_FILE");
  ASSERT_TRUE(server.ok());
  WaitMetric(**server, "vaedecode_worker_restarts_total", {"group=\"g0\""}, 1);
  EXPECT_EQ((*server)->Serving("vaedecode.v1.VaeDecoder/alpha").value_or(true), false);
  EXPECT_EQ((*server)->Serving("").value_or(true), false);
  const DecodeOutcome out = Decode((*server)->stub(), Request({1, 4, 2, 2}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr("still loading"));
  // Later starts no longer fail: the group comes up.
  std::filesystem::remove(fail_file);
  EXPECT_TRUE(
      (*server)->WaitServing("vaedecode.v1.VaeDecoder/alpha", true, absl::Seconds(20)).ok());
}

TEST(FakeWorkerServiceTest, ConcurrentClientsOnTwoGroups) {
  auto server = StartServing(Flags("cpu:4", 2));
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(4, absl::Seconds(10)).ok());
  std::vector<std::thread> threads;
  std::vector<std::vector<DecodeOutcome>> outcomes(8);
  std::vector<std::vector<v1::DecodeRequest>> requests(8);
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 4; ++i) {
      requests[t].push_back(Request({1 + i % 2, 4, 2 + t % 3, 3 + i},
                                    absl::StrCat("c", t, "-", i, "-sleep=5"), t * 100.0f + i));
    }
    threads.emplace_back([&, t] {
      for (const auto& r : requests[t]) outcomes[t].push_back(Decode(server->stub(), r));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < 4; ++i) ExpectFakeOutput(requests[t][i], outcomes[t][i]);
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {"status=\"OK\""}), 32);
}

TEST(FakeWorkerServiceTest, SigtermDrainsInFlightThenExitsZero) {
  auto server = StartServing(Flags("cpu:1", 1, {"--drain_timeout_s=20"}));
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest slow = Request({1, 4, 4, 4}, "sleep=100");
  DecodeOutcome running, queued;
  const v1::DecodeRequest second = Request({1, 4, 2, 2}, "queued-before-sigterm");
  std::thread a([&] { running = Decode(server->stub(), slow); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  std::thread b([&] { queued = Decode(server->stub(), second); });
  WaitMetric(*server, "vaedecode_queue_depth", {}, 1);
  server->Signal(SIGTERM);
  EXPECT_TRUE(server->WaitServing("", false, absl::Seconds(2)).ok());
  EXPECT_TRUE(server->WaitServing("vaedecode.v1.VaeDecoder/alpha", false, absl::Seconds(2)).ok());
  const DecodeOutcome refused = Decode(server->stub(), Request({1, 4, 2, 2}));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));
  a.join();
  b.join();
  ExpectFakeOutput(slow, running);
  ExpectFakeOutput(second, queued);
  absl::StatusOr<int> code = server->WaitExit(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(server->Workers().empty());
}

TEST(FakeWorkerServiceTest, DrainTimeoutCancelsWhatIsLeft) {
  auto server = StartServing(Flags("cpu:1", 1, {"--drain_timeout_s=1"}));
  ASSERT_NE(server, nullptr);
  DecodeOutcome running;
  std::thread a([&] { running = Decode(server->stub(), Request({1, 4, 4, 4}, "sleep=1000")); });
  WaitMetric(*server, "vaedecode_in_flight", {}, 1);
  const absl::Time t0 = absl::Now();
  server->Signal(SIGTERM);
  absl::StatusOr<int> code = server->WaitExit(absl::Seconds(10));
  a.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_FALSE(running.status.ok());
}

TEST(FakeWorkerServiceTest, MetricsScrapePassesPromtool) {
  auto server = StartServing(Flags("cpu:2", 2));
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest r = Request({1, 4, 2, 2});
  ExpectFakeOutput(r, Decode(server->stub(), r));
  Decode(server->stub(), Request({1, 5, 2, 2}));  // INVALID_ARGUMENT
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::string> check = PromtoolCheck(*m);
  EXPECT_TRUE(check.ok()) << check.status() << "\n" << *m;
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {"model=\"alpha\"", "status=\"OK\""}), 1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total",
                        {"model=\"alpha\"", "status=\"INVALID_ARGUMENT\""}),
            1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_decode_seconds_count",
                        {"family=\"fake\"", "mode=\"EXACT\"", "degree=\"2\""}),
            1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_collectives_per_decode_sum", {"family=\"fake\""}), 7);
  EXPECT_EQ(MetricValue(*m, "vaedecode_queue_seconds_count"), 1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_queue_depth"), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_in_flight"), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_device_free_bytes", {"device=\"cpu:1\""}), 8589934592.0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_device_peak_bytes", {"device=\"cpu:0\""}), 1048576.0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_group_ready", {"group=\"g0\""}), 1);
}

}  // namespace
}  // namespace vaedecode::testing
