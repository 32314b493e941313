// The service's API and its decodes, end to end with the real worker: a
// vaedecode_server process on loopback, real vaedecode_worker processes (Gloo
// groups on CPU), the diffusers fixtures (../shared/fixtures) as the model
// repository, real /metrics scrapes checked by promtool, the real
// vaedecode_client binary. Failures, queueing, deadlines, cancellation and
// drain are in service_supervision_test.cc.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "formats/npy.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

// One model's entry in ListModels.
const v1::ModelInfo* FindModel(const v1::ListModelsResponse& models, const std::string& name) {
  for (const v1::ModelInfo& m : models.models()) {
    if (m.name() == name) return &m;
  }
  return nullptr;
}

TEST(ServiceTest, EveryOutputFormatEqualsDiffusersAndTheApiAnswersClearly) {
  const std::string repo = FixtureRepository({"sd_kl", "flux1_kl"});
  constexpr int64_t kChunkBytes = 4096;
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2,
                                             {absl::StrCat("--chunk_bytes=", kChunkBytes),
                                              "--max_message_bytes=8388608", "--memory_budget_mib=4096"}),
                             {"sd_kl", "flux1_kl"});
  ASSERT_NE(server, nullptr);
  // What the metrics must show at the end, counted as the calls return.
  std::map<std::string, int> ok;  // by model
  int exact_decodes = 0;

  // The models the workers loaded, as ListModels and GetModel describe them.
  grpc::ClientContext list_ctx;
  v1::ListModelsResponse models;
  ASSERT_TRUE(server->stub().ListModels(&list_ctx, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 2);
  EXPECT_EQ(models.models(0).name(), "flux1_kl");
  EXPECT_EQ(models.models(1).name(), "sd_kl");
  const v1::ModelInfo* sd = FindModel(models, "sd_kl");
  const v1::ModelInfo* flux = FindModel(models, "flux1_kl");
  ASSERT_NE(sd, nullptr);
  ASSERT_NE(flux, nullptr);
  EXPECT_EQ(sd->diffusers_class(), "AutoencoderKL");
  EXPECT_EQ(sd->latent_channels(), 4);
  EXPECT_EQ(flux->latent_channels(), 16);
  EXPECT_EQ(sd->dtype(), "float32");
  EXPECT_THAT(sd->supported_modes(), Contains(v1::MODE_EXACT));  // a group of two ranks
  EXPECT_GT(sd->parameter_count(), 0);
  grpc::ClientContext get_ctx;
  v1::GetModelRequest get;
  get.set_name("sd_kl");
  v1::ModelInfo info;
  ASSERT_TRUE(server->stub().GetModel(&get_ctx, get, &info).ok());
  EXPECT_EQ(info.SerializeAsString(), sd->SerializeAsString());
  grpc::ClientContext missing_ctx;
  get.set_name("nope");
  const grpc::Status missing = server->stub().GetModel(&missing_ctx, get, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("flux1_kl, sd_kl"));

  // Every output format, against diffusers; the request id comes back, the
  // output arrives in chunks of at most --chunk_bytes.
  const std::vector<std::array<std::string, 3>> cases = {
      {"sd_kl", "sd_kl/latent.safetensors", "sd_kl/expected.safetensors"},
      {"sd_kl", "sd_kl/latent_b2.safetensors", "sd_kl/expected_b2.safetensors"},
      {"flux1_kl", "flux1_kl/latent.safetensors", "flux1_kl/expected.safetensors"},
  };
  for (const auto& [model, latent, expected_file] : cases) {
    const FloatTensor expected = ReadFloat(FixturePath(expected_file));
    for (v1::OutputFormat format : {v1::OUTPUT_FLOAT32, v1::OUTPUT_FLOAT16, v1::OUTPUT_UINT8, v1::OUTPUT_PNG}) {
      const std::string id = absl::StrCat(latent, "-", v1::OutputFormat_Name(format));
      SCOPED_TRACE(id);
      v1::DecodeRequest request = FixtureRequest(model, FixturePath(latent), format);
      request.set_request_id(id);
      const DecodeOutcome out = Decode(server->stub(), request);
      ExpectMatches(out, expected, format);
      ++ok[model];
      ++exact_decodes;
      const v1::Header& h = out.output.header();
      EXPECT_EQ(h.request_id(), id);
      EXPECT_EQ(h.mode(), v1::MODE_EXACT);
      EXPECT_EQ(h.degree(), 2);
      const int64_t factor = (model == "sd_kl" ? sd : flux)->spatial_factor();
      EXPECT_EQ(h.height(), request.latent().shape(2) * factor);
      EXPECT_EQ(h.width(), request.latent().shape(3) * factor);
      if (format != v1::OUTPUT_PNG) {
        const int64_t bytes = static_cast<int64_t>(out.output.tensor_bytes().size());
        EXPECT_GE(out.output.chunks(), (bytes + kChunkBytes - 1) / kChunkBytes);
      }
      const v1::Trailer& t = out.output.trailer();
      EXPECT_GT(t.collectives(), 0);
      EXPECT_EQ(t.peak_bytes_per_rank_size(), 2);
      // Each rank's time blocked in collectives: some, and never more than the decode.
      ASSERT_EQ(t.collective_wait_ms_per_rank_size(), 2);
      for (double ms : t.collective_wait_ms_per_rank()) {
        EXPECT_GT(ms, 0);
        EXPECT_LE(ms, t.timings().decode_ms());
      }
      EXPECT_GT(t.timings().decode_ms(), 0);
      EXPECT_GT(t.timings().queue_ms(), 0);
      EXPECT_GE(t.timings().total_ms(), t.timings().decode_ms());
    }
  }
  const FloatTensor sd_expected = ReadFloat(FixturePath("sd_kl/expected.safetensors"));
  // Raw (denoiser-space) latents get the family's de-normalisation.
  v1::DecodeRequest raw = FixtureRequest("sd_kl", FixturePath("sd_kl/pipeline_latent.safetensors"));
  raw.set_latent_space(v1::LATENT_SPACE_RAW);
  ExpectMatches(Decode(server->stub(), raw), sd_expected, v1::OUTPUT_FLOAT32);
  ++ok["sd_kl"];
  ++exact_decodes;
  // TILED on request: the group's ranks share the tiles; this latent fits
  // one tile, so the output is the dense one.
  const DecodeOutcome tiled = Decode(server->stub(), FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"),
                                                                    v1::OUTPUT_FLOAT32, v1::MODE_TILED));
  ExpectMatches(tiled, sd_expected, v1::OUTPUT_FLOAT32);
  ++ok["sd_kl"];
  EXPECT_EQ(tiled.output.header().mode(), v1::MODE_TILED);
  EXPECT_EQ(tiled.output.header().degree(), 2);
  EXPECT_THAT(tiled.output.header().tile_plan(), ::testing::StartsWith("1x1 tiles"));
  // No request id: the server makes one up (16 hex digits).
  const DecodeOutcome anonymous =
      Decode(server->stub(), FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors")));
  ExpectMatches(anonymous, sd_expected, v1::OUTPUT_FLOAT32);
  ++ok["sd_kl"];
  ++exact_decodes;
  EXPECT_THAT(anonymous.output.header().request_id(), ::testing::MatchesRegex("[0-9a-f]{16}"));

  // Bad input: the code and a message naming the problem, before any worker
  // sees it; the server keeps serving.
  const std::vector<BadRequestCase> bad = BadRequestCases("flux1_kl, sd_kl");
  std::map<std::pair<std::string, std::string>, int> refused;  // by (model label, code)
  for (const BadRequestCase& c : bad) {
    v1::DecodeRequest r = FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"));
    c.mutate(r);
    const DecodeOutcome out = Decode(server->stub(), r);
    EXPECT_EQ(out.status.error_code(), c.code) << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(out.messages, 0) << c.name;
    const bool known = r.model() == "sd_kl";
    ++refused[{known ? "sd_kl" : "_unknown", c.code == grpc::StatusCode::NOT_FOUND ? "NOT_FOUND" : "INVALID_ARGUMENT"}];
  }
  // More than twice --max_message_bytes (18 MB of latent): refused by gRPC itself
  // (between the two, the service refuses and counts it: reliability_test).
  const DecodeOutcome too_big = Decode(server->stub(), SyntheticRequest("sd_kl", {1, 4, 1024, 1100}));
  EXPECT_EQ(too_big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << too_big.status.error_message();
  ExpectMatches(Decode(server->stub(), FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"))), sd_expected,
                v1::OUTPUT_FLOAT32);
  ++ok["sd_kl"];
  ++exact_decodes;

  // Health: the server, the service and each model SERVING; unknown names
  // NOT_FOUND. Reflection lists the services.
  EXPECT_EQ(server->Serving("").value_or(false), true);
  EXPECT_EQ(server->Serving("vaedecode.v1.VaeDecoder").value_or(false), true);
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "sd_kl").value_or(false), true);
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "flux1_kl").value_or(false), true);
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "nope").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> services = server->ReflectionServices();
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services, Contains("vaedecode.v1.VaeDecoder"));
  EXPECT_THAT(*services, Contains("grpc.health.v1.Health"));

  // Metrics: scraped over HTTP, valid for promtool, every call counted.
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::string> check = PromtoolCheck(*m);
  EXPECT_TRUE(check.ok()) << check.status() << "\n" << *m;
  for (const auto& [model, count] : ok) {
    EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {absl::StrCat("model=\"", model, "\""), "status=\"OK\""}),
              count)
        << model;
  }
  for (const auto& [key, count] : refused) {
    EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total",
                          {absl::StrCat("model=\"", key.first, "\""), absl::StrCat("status=\"", key.second, "\"")}),
              count)
        << key.first << " " << key.second;
  }
  // The same counts under Triton's names; cumulative durations grow with them.
  for (const auto& [key, count] : refused) {
    EXPECT_EQ(MetricValue(*m, "vaedecode_request_failure",
                          {absl::StrCat("model=\"", key.first, "\""), absl::StrCat("reason=\"", key.second, "\"")}),
              count)
        << key.first << " " << key.second;
  }
  for (const auto& [model, count] : ok) {
    const std::string label = absl::StrCat("model=\"", model, "\"");
    EXPECT_EQ(MetricValue(*m, "vaedecode_request_success", {label}), count) << model;
    const double request_us = MetricValue(*m, "vaedecode_request_duration_us", {label});
    const double compute_us = MetricValue(*m, "vaedecode_compute_infer_duration_us", {label});
    const double queue_us = MetricValue(*m, "vaedecode_queue_duration_us", {label});
    EXPECT_GT(compute_us, 0) << model;
    EXPECT_GT(request_us, compute_us + queue_us) << model;
    EXPECT_EQ(MetricValue(*m, "vaedecode_pending_request_count", {label}), 0) << model;
    EXPECT_GT(MetricValue(*m, "vaedecode_decode_seconds_count", {label}), 0) << model;  // labelled by model
  }
  EXPECT_EQ(MetricValue(*m, "vaedecode_decode_seconds_count",
                        {"family=\"autoencoder_kl\"", "mode=\"EXACT\"", "degree=\"2\""}),
            exact_decodes);
  EXPECT_EQ(MetricValue(*m, "vaedecode_decode_seconds_count",
                        {"family=\"autoencoder_kl\"", "mode=\"TILED\"", "degree=\"2\""}),
            1);
  EXPECT_GT(MetricValue(*m, "vaedecode_collectives_per_decode_sum", {"mode=\"EXACT\""}), exact_decodes);
  EXPECT_EQ(MetricValue(*m, "vaedecode_collective_wait_seconds_count", {"mode=\"EXACT\""}), exact_decodes);
  EXPECT_GT(MetricValue(*m, "vaedecode_collective_wait_seconds_sum", {"mode=\"EXACT\""}), 0);
  // Only the decodes waited in the queue; refused calls never got there.
  EXPECT_EQ(MetricValue(*m, "vaedecode_queue_seconds_count"), ok["sd_kl"] + ok["flux1_kl"]);
  EXPECT_EQ(MetricValue(*m, "vaedecode_queue_depth"), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_in_flight"), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_group_ready", {"group=\"g0\""}), 1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_worker_restarts_total", {"group=\"g0\""}), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_tile_retries_total", {"model=\"sd_kl\""}), 0);
  // Each rank's measured peak and its free memory under --memory_budget_mib.
  for (const std::string device : {"cpu:0", "cpu:1"}) {
    const std::string label = absl::StrCat("device=\"", device, "\"");
    EXPECT_GT(MetricValue(*m, "vaedecode_device_peak_bytes", {label}), 0) << device;
    const double free = MetricValue(*m, "vaedecode_device_free_bytes", {label});
    EXPECT_GT(free, 0) << device;
    EXPECT_LE(free, 4096.0 * (1 << 20)) << device;
  }
}

TEST(ServiceTest, VideoModelStreamsFrames) {
  const std::string repo = FixtureRepository({"wan21"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2), {"wan21"});
  ASSERT_NE(server, nullptr);
  const FloatTensor expected = ReadFloat(FixturePath("wan21/expected.safetensors"));
  for (v1::OutputFormat format : {v1::OUTPUT_FLOAT32, v1::OUTPUT_PNG}) {
    SCOPED_TRACE(v1::OutputFormat_Name(format));
    ExpectMatches(Decode(server->stub(), FixtureRequest("wan21", FixturePath("wan21/latent.safetensors"), format)),
                  expected, format);
  }
}

TEST(ServiceTest, PackedRawFlux2LatentsInEveryMode) {
  // FLUX.2's pipeline latent packs 2x2 patches (4x the channels, half the
  // size): accepted as latent_space RAW, unpacked before any sharding or
  // tiling, diffusers' output in every mode.
  const std::string repo = FixtureRepository({"flux2_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2), {"flux2_kl"});
  ASSERT_NE(server, nullptr);
  const FloatTensor expected = ReadFloat(FixturePath("flux2_kl/expected.safetensors"));
  for (v1::Mode mode : {v1::MODE_AUTO, v1::MODE_DENSE, v1::MODE_TILED}) {
    SCOPED_TRACE(v1::Mode_Name(mode));
    v1::DecodeRequest raw =
        FixtureRequest("flux2_kl", FixturePath("flux2_kl/pipeline_latent.safetensors"), v1::OUTPUT_FLOAT32, mode);
    raw.set_latent_space(v1::LATENT_SPACE_RAW);
    ExpectMatches(Decode(server->stub(), raw), expected, v1::OUTPUT_FLOAT32);
  }
  // The packed latent sent as VAE space is refused with a hint.
  const DecodeOutcome unmarked =
      Decode(server->stub(), FixtureRequest("flux2_kl", FixturePath("flux2_kl/pipeline_latent.safetensors")));
  EXPECT_EQ(unmarked.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(unmarked.status.error_message(), HasSubstr("latent_space RAW"));
}

TEST(ServiceTest, ExactOnGroupsOfTwoAndThreeEqualsDense) {
  const std::string repo = FixtureRepository({"sd_kl", "flux1_kl"});
  for (int g : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("group size ", g));
    auto server = StartServing(RealWorkerFlags(repo, absl::StrCat("cpu:", g), g), {"sd_kl", "flux1_kl"});
    ASSERT_NE(server, nullptr);
    for (const auto& [model, latent] : std::vector<std::pair<std::string, std::string>>{
             {"sd_kl", "sd_kl/latent.safetensors"}, {"flux1_kl", "flux1_kl/latent.safetensors"}}) {
      const DecodeOutcome exact =
          Decode(server->stub(), FixtureRequest(model, FixturePath(latent), v1::OUTPUT_FLOAT32, v1::MODE_EXACT));
      const DecodeOutcome dense =
          Decode(server->stub(), FixtureRequest(model, FixturePath(latent), v1::OUTPUT_FLOAT32, v1::MODE_DENSE));
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

TEST(ServiceTest, ConcurrentClientsOnTwoGroupsAndTheClientBinary) {
  const std::string repo = FixtureRepository({"sd_kl", "flux1_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:4", 2), {"sd_kl", "flux1_kl"});
  ASSERT_NE(server, nullptr);
  // Both groups up (a model serves as soon as one group is).
  for (const std::string group : {"g0", "g1"}) {
    absl::Status up =
        server->WaitMetric("vaedecode_group_ready", {absl::StrCat("group=\"", group, "\"")}, 1, absl::Seconds(120));
    ASSERT_TRUE(up.ok()) << up;
  }
  const std::vector<std::array<std::string, 3>> cases = {
      {"sd_kl", "sd_kl/latent.safetensors", "sd_kl/expected.safetensors"},
      {"sd_kl", "sd_kl/latent_b2.safetensors", "sd_kl/expected_b2.safetensors"},
      {"flux1_kl", "flux1_kl/latent.safetensors", "flux1_kl/expected.safetensors"},
  };
  // 8 concurrent clients x 25 requests: none lost, every output correct.
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::vector<DecodeOutcome>> outcomes(kThreads);
  std::vector<std::thread> threads;
  std::map<std::string, int> sent;  // by model
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) ++sent[cases[(t + i) % cases.size()][0]];
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const auto& c = cases[(t + i) % cases.size()];
        outcomes[t].push_back(Decode(server->stub(), FixtureRequest(c[0], FixturePath(c[1]))));
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<FloatTensor> expected_by_case;
  for (const auto& c : cases) expected_by_case.push_back(ReadFloat(FixturePath(c[2])));
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(outcomes[t].size(), static_cast<size_t>(kEach));
    for (int i = 0; i < kEach; ++i) {
      ExpectMatches(outcomes[t][i], expected_by_case[(t + i) % cases.size()], v1::OUTPUT_FLOAT32);
    }
  }
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  for (const auto& [model, count] : sent) {
    EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {absl::StrCat("model=\"", model, "\""), "status=\"OK\""}),
              count)
        << model;
  }
  // Both groups decoded (a rank's peak is reported once it has decoded).
  for (const std::string group : {"g0", "g1"}) {
    EXPECT_GT(MetricValue(*m, "vaedecode_device_peak_bytes", {absl::StrCat("group=\"", group, "\"")}), 0) << group;
  }

  // The client binary, like the CLI: .npy and .png outputs.
  const std::string out = TempDir("client");
  for (const std::string& file : {std::string("sample.npy"), std::string("b2.png")}) {
    const bool png = file == "b2.png";
    const CommandResult client = RunCommand(absl::StrCat(
        Runfile("client/vaedecode_client"), " --server=", server->address(), " --model=sd_kl", " --latent=",
        FixturePath(png ? "sd_kl/latent_b2.safetensors" : "sd_kl/latent.safetensors"), " --out=", out, "/", file));
    EXPECT_EQ(client.status, 0) << client.output;
    EXPECT_THAT(client.output, HasSubstr("mode=MODE_EXACT degree=2"));
  }
  // Request options come from rpc/request_options' table, in either
  // spelling, with the value joined by '=' or as the next argument.
  const CommandResult dense = RunCommand(absl::StrCat(
      Runfile("client/vaedecode_client"), " --server=", server->address(),
      " --model=sd_kl --mode dense --latent=", FixturePath("sd_kl/latent.safetensors"), " --out=", out, "/d.npy"));
  EXPECT_EQ(dense.status, 0) << dense.output;
  EXPECT_THAT(dense.output, HasSubstr("mode=MODE_DENSE"));
  const CommandResult refused =
      RunCommand(absl::StrCat(Runfile("client/vaedecode_client"), " --server=", server->address(),
                              " --model=sd_kl --jpeg-quality=0 --out=", out, "/q.jpg"));
  EXPECT_EQ(WEXITSTATUS(refused.status), 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("--jpeg_quality: \"0\"; use an integer 1..100"));
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

}  // namespace
}  // namespace vaedecode::testing
