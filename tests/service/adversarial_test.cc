// Everything an adversarial user tried against the service, replayed on one
// real server (two CPU ranks in one group, loopback) while a well-behaved
// client keeps decoding: malformed requests, a request that can never fit,
// costly, non-finite and oversized requests, forged log lines, a stalled
// reader, a cancelled long decode, a stopped and a killed worker, probes of
// the internal protocol; and issue 35's list: a model that cannot load, a
// gzip request, a stalled upload, an attention over too many positions,
// slowloris connections on the HTTP and metrics ports. The server must
// answer each with a clear status, keep serving, and lose nothing: every
// call it received ends, and is counted, exactly once.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/attacks.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

v1::DecodeRequest Small(const std::string& id = "") {
  v1::DecodeRequest r = FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"));
  r.set_request_id(id);
  return r;
}

void ExpectReached(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

// Resident bytes of a process (/proc/PID/statm); 0 when unreadable.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

// Decodes Small() in a loop until stopped, checking every output; counts
// the outcomes by status code.
class WellBehavedClient {
 public:
  explicit WellBehavedClient(ServerProcess& server)
      : thread_([this, &server] {
          const FloatTensor expected = ReadFloat(FixturePath("sd_kl/expected.safetensors"));
          for (int i = 0; !stop_.load(); ++i) {
            const DecodeOutcome out = Decode(server.stub(), Small(absl::StrCat("canary-", i)), absl::Seconds(60));
            if (out.status.ok()) ExpectMatches(out, expected, v1::OUTPUT_FLOAT32);
            absl::MutexLock lock(&mu_);
            ++codes_[out.status.error_code()];
          }
        }) {}
  // Stops, joins; the outcomes.
  std::map<grpc::StatusCode, int> Stop() {
    stop_ = true;
    thread_.join();
    absl::MutexLock lock(&mu_);
    return codes_;
  }

 private:
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::map<grpc::StatusCode, int> codes_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

TEST(AdversarialTest, EveryAttackGetsAClearAnswerAndNothingIsLost) {
  const std::string repo = FixtureRepository({"sd_kl"});
  nlohmann::json zero_groups = nlohmann::json::parse(std::ifstream(FixturePath("sd_kl/config.json")));
  zero_groups["norm_num_groups"] = 0;  // SIGFPE'd every worker at load
  WriteModelFolder(repo + "/zero_groups", zero_groups, "sd_kl");
  auto server =
      StartServing(RealWorkerFlags(repo, "cpu:2", 2,
                                   {"--memory_budget_mib=512", "--heartbeat_timeout_s=2", "--stream_stall_timeout_s=2",
                                    "--max_output_pixels=0,sd_kl=3000000", "--max_message_bytes=4194304",
                                    "--chunk_bytes=65536", "--max_queue=64", "--max_attention_tokens=2048",
                                    "--http_listen=127.0.0.1:0", "--http_header_timeout_s=2"}),
                   {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(2, absl::Seconds(10)).ok());
  // Slow connections on the metrics port throughout: every scrape below
  // must still be answered.
  std::vector<std::thread> slow_scrapers;
  for (int i = 0; i < 8; ++i) {
    slow_scrapers.emplace_back([port = server->metrics_port()] {
      TrickleHttpRequest(port, "GET /metrics HTTP/1.1\r\n", std::string(600, 'X'), 0.5, 30);
    });
  }
  int sent = 0;  // calls this test makes, besides the well-behaved client's
  const auto call = [&](const v1::DecodeRequest& r, absl::Duration deadline = absl::Seconds(60)) {
    ++sent;
    return Decode(server->stub(), r, deadline);
  };
  WellBehavedClient canary(*server);

  // 1. The malformed-request table.
  for (const BadRequestCase& c : BadRequestCases("sd_kl")) {
    v1::DecodeRequest r = Small();
    c.mutate(r);
    const DecodeOutcome out = call(r);
    EXPECT_EQ(out.status.error_code(), c.code) << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
  }

  // The fixture decoder's spatial factor sizes the requests below (4 when written).
  grpc::ClientContext info_ctx;
  v1::GetModelRequest get;
  get.set_name("sd_kl");
  v1::ModelInfo model;
  ASSERT_TRUE(server->stub().GetModel(&info_ctx, get, &model).ok());
  ASSERT_EQ(model.spatial_factor(), 4) << "resize the requests below";

  // 2. Costly, non-finite and oversized requests.
  const DecodeOutcome costly = call(SyntheticRequest("sd_kl", {12, 4, 128, 128}));  // 3.1M pixels, 3.1 MB
  EXPECT_EQ(costly.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(costly.status.error_message(), HasSubstr("--max_output_pixels"));
  v1::DecodeRequest nan = SyntheticRequest("sd_kl", {1, 4, 16, 16});
  const float not_a_number = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&(*nan.mutable_latent()->mutable_data())[0], &not_a_number, 4);
  EXPECT_THAT(call(nan).status.error_message(), HasSubstr("not finite"));
  EXPECT_EQ(call(SyntheticRequest("sd_kl", {1, 4, 512, 512})).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);  // 4 MiB of latent + framing

  // 3. A request whose smallest tile (150 latents of 32 x 32, about 1 GB)
  // can never fit the 512 MiB budget: refused at once, not queued forever.
  {
    const absl::Time t0 = absl::Now();
    const DecodeOutcome never = call(SyntheticRequest("sd_kl", {150, 4, 32, 32}), absl::Seconds(60));
    EXPECT_EQ(never.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << never.status.error_message();
    EXPECT_THAT(never.status.error_message(), HasSubstr("can never be decoded"));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  }

  // 4. Forged log lines.
  EXPECT_TRUE(call(Small("x\nrequest id=forged status=OK")).status.ok());

  // 5. A long decode cancelled midway, then a stalled reader.
  {
    BackgroundDecode cancelled(*server, SyntheticRequest("sd_kl", {256, 4, 16, 16}, "to-cancel"));
    ++sent;
    absl::SleepFor(absl::Milliseconds(500));
    cancelled.Cancel();
    EXPECT_EQ(cancelled.Join().status.error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    const std::unique_ptr<v1::VaeDecoder::Stub> slow = server->SlowReaderStub();
    ++sent;
    const DecodeOutcome stalled = Decode(*slow, SyntheticRequest("sd_kl", {64, 4, 16, 16}, "stalls"), absl::Seconds(60),
                                         [](int n, grpc::ClientContext&) {
                                           if (n == 1) absl::SleepFor(absl::Seconds(5));
                                         });
    EXPECT_EQ(stalled.status.error_code(), grpc::StatusCode::CANCELLED) << stalled.status.error_message();
  }

  // 6. Issue 35's list.
  // A model that cannot load is unavailable by name; sd_kl is served.
  const DecodeOutcome unloadable = call([&] {
    v1::DecodeRequest r = Small("to-a-bad-model");
    r.set_model("zero_groups");
    return r;
  }());
  EXPECT_EQ(unloadable.status.error_code(), grpc::StatusCode::UNAVAILABLE) << unloadable.status.error_message();
  EXPECT_THAT(unloadable.status.error_message(), HasSubstr("norm_num_groups"));
  // A gzip request is refused before it inflates (by gRPC: no handler runs).
  {
    grpc::ClientContext ctx;
    ctx.set_compression_algorithm(GRPC_COMPRESS_GZIP);
    auto reader = server->stub().Decode(&ctx, Small("gzip"));
    v1::DecodeResponse message;
    while (reader->Read(&message)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  // An attention over more positions than --max_attention_tokens (64 x 64).
  const DecodeOutcome attention = call(SyntheticRequest("sd_kl", {1, 4, 64, 64}));
  EXPECT_EQ(attention.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(attention.status.error_message(), HasSubstr("--max_attention_tokens"));
  // An upload that stalls before its message is whole ends at its deadline;
  // only gRPC's own counts have it (no handler ran).
  {
    const absl::StatusOr<std::string> before = server->ScrapeMetrics();
    ASSERT_TRUE(before.ok()) << before.status();
    const double failed_before = MetricValue(*before, "vaedecode_grpc_calls_total", {"outcome=\"failed\""});
    StallingProxy proxy(server->port(), size_t{3} << 20);
    auto stub = v1::VaeDecoder::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", proxy.port()), grpc::InsecureChannelCredentials()));
    const DecodeOutcome stalled =
        Decode(*stub, SyntheticRequest("sd_kl", {1, 4, 480, 480}, "stalled-upload"), absl::Seconds(3));
    EXPECT_EQ(stalled.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << stalled.status.error_message();
    ExpectReached(server->WaitMetric("vaedecode_grpc_calls_total", {"outcome=\"failed\""},
                                     [&](double failed) { return failed >= failed_before + 1; }));
  }
  // Slowloris on the HTTP port: cut at --http_header_timeout_s with a 408.
  const std::string slowloris =
      TrickleHttpRequest(server->http_port(), "GET /health HTTP/1.1\r\n", std::string(200, 'X'), 0.2, 30);
  EXPECT_TRUE(absl::StartsWith(slowloris, "HTTP/1.1 408")) << slowloris;
  EXPECT_THAT(slowloris, HasSubstr("--http_header_timeout_s"));

  // 7. A stopped peer during a decode, then a killed leader: the decode
  // fails UNAVAILABLE, the group is rebuilt and serves again.
  const auto fail_rank_during_a_decode = [&](int rank, int sig, const std::string& id) {
    const WorkerProcess victim_rank = Rank(*server, rank);
    ASSERT_GT(victim_rank.pid, 0);
    const int64_t resident_before = ResidentBytes(victim_rank.pid);
    BackgroundDecode victim(*server, SyntheticRequest("sd_kl", {256, 4, 16, 16}, id));
    ++sent;
    // The victim may wait behind a canary call (the first decode of a fresh
    // incarnation is slow on a loaded machine): strike once its decode runs
    // on the rank, which its activations (~200 MiB, a canary's ~2 MiB) show.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (ResidentBytes(victim_rank.pid) < resident_before + (int64_t{64} << 20) && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_GE(ResidentBytes(victim_rank.pid), resident_before + (int64_t{64} << 20)) << id << ": never ran";
    ASSERT_EQ(kill(victim_rank.pid, sig), 0);
    EXPECT_EQ(victim.Join().status.error_code(), grpc::StatusCode::UNAVAILABLE) << id;
    ASSERT_TRUE(server->WaitWorkers(2, absl::Seconds(30), victim_rank.group).ok());
    ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  };
  fail_rank_during_a_decode(1, SIGSTOP, "victim-of-a-hang");
  fail_rank_during_a_decode(0, SIGKILL, "victim-of-a-crash");

  // The well-behaved client saw only successes, apart from calls that ran on
  // the group while it failed (UNAVAILABLE, retry): no deadline, no hang.
  const std::map<grpc::StatusCode, int> canary_codes = canary.Stop();
  int canary_calls = 0;
  for (const auto& [code, n] : canary_codes) {
    canary_calls += n;
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::UNAVAILABLE)
        << n << " canary call(s) ended " << code;
  }
  EXPECT_GT(canary_codes.count(grpc::StatusCode::OK) ? canary_codes.at(grpc::StatusCode::OK) : 0, 10);

  // Nothing lost: every call ended and was counted once; nothing is left
  // running, queued or buffered; the group serves.
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 0));
  ExpectReached(server->WaitMetric("vaedecode_queue_depth", {}, 0));
  ExpectReached(server->WaitMetric("vaedecode_output_buffer_bytes", {}, 0, absl::Seconds(5)));
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {}, sent + canary_calls));
  ExpectOk(call(Small("after-everything")));
  const std::string log = server->Log();
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, "request id=forged")) << line;
  }
  EXPECT_EQ(server->Serving("vaedecode.v1.VaeDecoder").value_or(false), true);
  EXPECT_THAT(log, ::testing::Not(HasSubstr("id=stalled-upload")));
  for (std::thread& t : slow_scrapers) t.join();
}

}  // namespace
}  // namespace vaedecode::testing
