// Reliability on the real server with real workers (loopback, CPU Gloo
// groups): no stuck process holds a group, and client-supplied strings
// cannot forge log lines. Each test fails on a server without the fix it
// names.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

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

}  // namespace
}  // namespace vaedecode::testing
