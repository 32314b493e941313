// Reliability on the real server with real workers (loopback, CPU Gloo
// groups): no stuck process holds a group, and client-supplied strings
// cannot forge log lines. Each test fails on a server without the fix it
// names.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// A decode of several seconds on sd_kl (about 10 ms per [4, 16, 16] latent).
v1::DecodeRequest Long(const std::string& id) {
  return SyntheticRequest("sd_kl", {512, 4, 16, 16}, id);
}

v1::DecodeRequest Small(const std::string& id = "") {
  v1::DecodeRequest r = FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"));
  r.set_request_id(id);
  return r;
}

void ExpectReached(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

// Without heartbeats a SIGSTOPped rank is found only by the collective
// timeout (300 s here): the request would run into its client's deadline.
TEST(ReliabilityTest, AStoppedRankIsFoundWithinSecondsAndTheGroupIsRebuilt) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(
      RealWorkerFlags(repo, "cpu:2", 2, {"--heartbeat_timeout_s=2", "--collective_timeout_s=300"}),
      {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(2, absl::Seconds(10)).ok());

  // A peer stops in the middle of a decode.
  const WorkerProcess peer = Rank(*server, 1);
  ASSERT_GT(peer.pid, 0);
  {
    BackgroundDecode victim(*server, Long("victim"), absl::Seconds(60));
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(kill(peer.pid, SIGSTOP), 0);
    const absl::Time stopped = absl::Now();
    const DecodeOutcome& out = victim.Join();
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(absl::StrCat("rank 1 (pid ", peer.pid)));
    EXPECT_THAT(out.status.error_message(), HasSubstr("stopped answering"));
    // The heartbeat timeout plus the supervisor's poll; far below any collective timeout.
    EXPECT_LT(absl::Now() - stopped, absl::Seconds(10));
  }
  ASSERT_TRUE(
      server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 1));
  ExpectOk(Decode(server->stub(), Small()));

  // An idle leader stops: health goes NOT_SERVING and the group is rebuilt
  // on its own; a request sent meanwhile is answered, not left hanging.
  absl::StatusOr<std::vector<WorkerProcess>> rebuilt =
      server->WaitWorkers(2, absl::Seconds(10), peer.group);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  const WorkerProcess leader = Rank(*server, 0);
  ASSERT_GT(leader.pid, 0);
  ASSERT_EQ(kill(leader.pid, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  const DecodeOutcome during = Decode(server->stub(), Small("while-the-leader-is-stopped"),
                                      absl::Seconds(120));
  EXPECT_TRUE(during.status.ok() ||
              during.status.error_code() == grpc::StatusCode::UNAVAILABLE)
      << during.status.error_message();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(30));
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 2,
                                   absl::Seconds(30)));
  ASSERT_TRUE(
      server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  ExpectOk(Decode(server->stub(), Small()));
  EXPECT_THAT(server->Log(), HasSubstr("stopped answering: no heartbeat for"));
}

// A request id with a newline used to start a forged line of its own.
TEST(ReliabilityTest, ClientStringsCannotForgeLogLinesOrFields) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const std::string forged_id = "evil\nrequest id=forged model=sd_kl status=OK";
  ExpectOk(Decode(server->stub(), Small(forged_id)));
  v1::DecodeRequest unknown = Small("unknown-model");
  unknown.set_model("nope\nrequest id=forged2 status=OK");
  EXPECT_EQ(Decode(server->stub(), unknown).status.error_code(), grpc::StatusCode::NOT_FOUND);

  // The request lines are written when the calls end: wait for both.
  std::string log;
  for (int i = 0; i < 100; ++i) {
    log = server->Log();
    if (absl::StrContains(log, "id=unknown-model")) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(log, HasSubstr("id=\"evil\\nrequest id=forged model=sd_kl status=OK\""));
  EXPECT_THAT(log, HasSubstr("model=\"nope\\nrequest id=forged2 status=OK\""));
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    EXPECT_FALSE(absl::StartsWith(line, "request id=forged")) << line;
  }
}

// The group hands finished output to the server and serves the next
// request while a slow client reads; a client that stops reading is cut off.
// Before, the group waited on the client (8 messages of buffer).
TEST(ReliabilityTest, ASlowReaderDoesNotHoldTheGroupAndAStalledOneIsCancelled) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(
      RealWorkerFlags(repo, "cpu:1", 1, {"--stream_stall_timeout_s=2", "--chunk_bytes=65536"}),
      {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const std::unique_ptr<v1::VaeDecoder::Stub> slow = server->SlowReaderStub();
  // 12.6 MB of float32 output in 64 KiB chunks; the client stops after the header.
  constexpr absl::Duration kStall = absl::Seconds(6);
  DecodeOutcome stalled;
  std::thread reader([&] {
    stalled = Decode(*slow, SyntheticRequest("sd_kl", {64, 4, 16, 16}, "stalls"), absl::Seconds(60),
                     [&](int n, grpc::ClientContext&) {
                       if (n == 1) absl::SleepFor(kStall);
                     });
  });
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  const absl::Time t0 = absl::Now();
  // The decode ends and the group is free although the client reads nothing.
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 0, absl::Seconds(5)));
  const DecodeOutcome next = Decode(server->stub(), Small("behind-the-stalled-one"));
  ExpectOk(next);
  EXPECT_LT(absl::Now() - t0, kStall);
  EXPECT_LT(next.output.trailer().timings().queue_ms(), 1000);
  // The stalled call was cancelled by the server while its client slept.
  ExpectReached(server->WaitMetric("vaedecode_stalled_streams_total", {}, 1, absl::Seconds(10)));
  reader.join();
  EXPECT_EQ(stalled.status.error_code(), grpc::StatusCode::CANCELLED) << stalled.status.error_message();
  ExpectReached(server->WaitMetric("vaedecode_output_buffer_bytes", {}, 0, absl::Seconds(5)));
  ExpectOk(Decode(server->stub(), Small()));
}

TEST(ReliabilityTest, AdmissionRefusesCostlyNonFiniteAndOversizedRequestsAndKeepsServing) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1,
                                             {"--max_output_pixels=0,sd_kl=100000",
                                              "--max_message_bytes=1048576", "--chunk_bytes=65536"}),
                             {"sd_kl"});
  ASSERT_NE(server, nullptr);
  // 8 images of 128 x 128 = 131072 pixels.
  grpc::ClientContext ctx;
  v1::GetModelRequest get;
  get.set_name("sd_kl");
  v1::ModelInfo info;
  ASSERT_TRUE(server->stub().GetModel(&ctx, get, &info).ok());
  const int64_t side = 128 / info.spatial_factor();
  const DecodeOutcome costly = Decode(server->stub(), SyntheticRequest("sd_kl", {8, 4, side, side}));
  EXPECT_EQ(costly.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(costly.status.error_message(), HasSubstr("decodes to 131072 output pixels"));
  EXPECT_THAT(costly.status.error_message(), HasSubstr("limit of 100000 for model \"sd_kl\""));

  v1::DecodeRequest nan = SyntheticRequest("sd_kl", {1, 4, 16, 16});
  std::string data = nan.latent().data();
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 3; ++i) std::memcpy(&data[4 * (10 + 7 * i)], &bad[i], 4);
  nan.mutable_latent()->set_data(data);
  const DecodeOutcome refused = Decode(server->stub(), nan);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("3 of 1024 values are not finite"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("the first is element 10"));

  // Over --max_message_bytes (1 MiB): refused, explained and counted.
  const DecodeOutcome oversized = Decode(server->stub(), SyntheticRequest("sd_kl", {1, 4, 256, 256}));
  EXPECT_EQ(oversized.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(oversized.status.error_message(), HasSubstr("more than this server's --max_message_bytes=1048576"));
  ExpectReached(server->WaitMetric("vaedecode_rejected_requests_total", {"reason=\"message_too_large\""}, 1,
                                   absl::Seconds(5)));
  ExpectMatches(Decode(server->stub(), Small()), ReadFloat(FixturePath("sd_kl/expected.safetensors")),
                v1::OUTPUT_FLOAT32);
}

}  // namespace
}  // namespace vaedecode::testing
