// The service under load and failure, with the real worker: a
// vaedecode_server process on loopback supervising real vaedecode_worker
// processes (Gloo groups on CPU) on the diffusers fixtures. Queueing,
// deadlines, cancellation, killed ranks (peer and leader), worker groups that
// cannot start, and the SIGTERM drain. Slow decodes are big batches of small
// latents on sd_kl (many short ops, so the leader, which checks for a
// cancellation between ops, stops within milliseconds; a big latent spends
// seconds in one attention op); the embedded default model (no
// --model_repository) decodes [1, 4, 48, 48] for seconds.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// [batch, 4, 16, 16] on sd_kl: about 10 ms per latent on one CPU rank.
v1::DecodeRequest Slow(int batch, const std::string& id) { return SyntheticRequest("sd_kl", {batch, 4, 16, 16}, id); }
// The batch of the reference decode the timings below are measured against
// (about a second); decodes to be cut short are four times as long.
constexpr int kReference = 128;
constexpr int kLong = 4 * kReference;

// The sd_kl fixture: a decode of a few milliseconds, with its reference.
v1::DecodeRequest Small(const std::string& id = "") {
  v1::DecodeRequest r = FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"));
  r.set_request_id(id);
  return r;
}
const FloatTensor& SmallExpected() {
  static const FloatTensor* expected = new FloatTensor(ReadFloat(FixturePath("sd_kl/expected.safetensors")));
  return *expected;
}

// Fails the test unless `s` is OK.
void ExpectReached(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

TEST(ServiceSupervisionTest, QueueFullDeadlinesAndCancellationOnOneRank) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1, {"--max_queue=1", "--chunk_bytes=65536"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);

  // Queue full: one running, one queued, the third refused at once.
  absl::Duration reference;  // the decode time of Slow(kReference)
  {
    BackgroundDecode running(*server, Slow(kReference, "running"));
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    BackgroundDecode queued(*server, Small("queued"));
    ExpectReached(server->WaitMetric("vaedecode_queue_depth", {}, 1));
    const absl::Time t0 = absl::Now();
    const DecodeOutcome refused = Decode(server->stub(), Small());
    EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("queue is full"));
    ExpectOk(running.Join());
    ExpectMatches(queued.Join(), SmallExpected(), v1::OUTPUT_FLOAT32);
    const double running_ms = running.Join().output.trailer().timings().decode_ms();
    reference = absl::Milliseconds(running_ms);
    // The queued request waited for (most of) the running decode.
    EXPECT_GT(queued.Join().output.trailer().timings().queue_ms(), 0.5 * running_ms);
  }
  ASSERT_GT(reference, absl::Milliseconds(200)) << "too fast to time anything against";

  // EXACT cannot run on groups of one rank: refused up front.
  v1::DecodeRequest exact = Small();
  exact.set_mode(v1::MODE_EXACT);
  const DecodeOutcome no_exact = Decode(server->stub(), exact);
  EXPECT_EQ(no_exact.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_exact.status.error_message(), HasSubstr("EXACT needs a worker group of at least 2 ranks"));

  // Deadline exceeded while queued behind a slow decode: the call ends at
  // its deadline, not when the group gets to it, and leaves the queue.
  {
    BackgroundDecode running(*server, Slow(kReference, "running-2"));
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    const absl::Time t0 = absl::Now();
    const DecodeOutcome late = Decode(server->stub(), Small(), absl::Milliseconds(300));
    EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
    ExpectReached(server->WaitMetric("vaedecode_queue_depth", {}, 0));
    ExpectOk(running.Join());
  }
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, 1));

  // Deadline exceeded during the decode (a quarter of the way through): the
  // leader stops, so the next request does not wait for the rest of it.
  {
    const absl::Time t0 = absl::Now();
    const DecodeOutcome cut = Decode(server->stub(), Slow(kLong, "deadline-mid-decode"), reference);
    EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_EQ(cut.messages, 0);  // still decoding
    ExpectMatches(Decode(server->stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);
    // Without the stop: about 4 × reference after t0.
    EXPECT_LT(absl::Now() - t0, 3 * reference);
  }
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, 2));

  // Cancellation during the decode stops the work on the group: the next
  // request does not wait for the rest of a long decode.
  {
    BackgroundDecode cancelled(*server, Slow(kLong, "to-cancel"));
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(cancelled.Cancel());
    const absl::Time t0 = absl::Now();
    EXPECT_EQ(cancelled.Join().status.error_code(), grpc::StatusCode::CANCELLED);
    ExpectMatches(Decode(server->stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);
    // Without the stop the small decode would wait for the rest of the long
    // one (about 4 × reference - 0.3 s); the bound leaves room for a loaded
    // machine while still telling the two apart.
    EXPECT_LT(absl::Now() - t0, 3 * reference);
  }
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"CANCELLED\""}, 1));

  // Cancellation mid-stream, while the server waits for the client to read.
  const std::unique_ptr<v1::VaeDecoder::Stub> slow_reader = server->SlowReaderStub();
  const DecodeOutcome mid =
      Decode(*slow_reader, Slow(kReference / 2, "mid-stream"), absl::Seconds(60), [](int n, grpc::ClientContext& ctx) {
        if (n == 2) ctx.TryCancel();
      });
  EXPECT_EQ(mid.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GE(mid.messages, 2);
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"CANCELLED\""}, 2));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 0));
  ExpectMatches(Decode(server->stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);

  // Deadline exceeded between chunks: the client stops reading after the
  // second message until its deadline has passed. The server ends the call
  // as failed and the group is free at once.
  // A write is in flight when the deadline passes and fails first; the call
  // is still counted as DEADLINE_EXCEEDED, not as a cancellation.
  {
    const std::unique_ptr<v1::VaeDecoder::Stub> stalled = server->SlowReaderStub();
    // Slow(kReference / 2) decodes in about reference / 2.
    const absl::Duration deadline = 2 * reference + absl::Milliseconds(500);
    const absl::Time until = absl::Now() + deadline + absl::Milliseconds(300);
    const DecodeOutcome cut =
        Decode(*stalled, Slow(kReference / 2, "deadline-mid-stream"), deadline, [until](int n, grpc::ClientContext&) {
          if (n == 2) absl::SleepFor(until - absl::Now());
        });
    EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << cut.status.error_message();
    EXPECT_GE(cut.messages, 2);  // it was streaming
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 0));
    // Counted once, as a deadline: 2 deadlines and 2 cancellations before it.
    ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"DEADLINE_EXCEEDED\""}, 3));
    absl::StatusOr<std::string> counts = server->ScrapeMetrics();
    ASSERT_TRUE(counts.ok()) << counts.status();
    EXPECT_EQ(MetricValue(*counts, "vaedecode_requests_total", {"status=\"CANCELLED\""}), 2);
    const absl::Time t0 = absl::Now();
    ExpectMatches(Decode(server->stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);
    EXPECT_LT(absl::Now() - t0, reference);
  }
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  // Every decode that ran to the end, and only those.
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {"status=\"OK\""}), 7);
  // None of this broke the group.
  EXPECT_EQ(MetricValue(*m, "vaedecode_worker_restarts_total", {"group=\"g0\""}), 0);
}

TEST(ServiceSupervisionTest, CancellationStopsEveryRankAndLeavesTheGroupInStep) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::vector<WorkerProcess>> workers = server->WaitWorkers(2, absl::Seconds(10));
  ASSERT_TRUE(workers.ok()) << workers.status();
  // The reference: an exact decode over both ranks.
  const DecodeOutcome timed = Decode(server->stub(), Slow(kReference, "reference"));
  ExpectOk(timed);
  EXPECT_EQ(timed.output.header().mode(), v1::MODE_EXACT);
  const absl::Duration reference = absl::Milliseconds(timed.output.trailer().timings().decode_ms());
  ASSERT_GT(reference, absl::Milliseconds(100)) << "too fast to time anything against";

  BackgroundDecode cancelled(*server, Slow(kLong, "exact-to-cancel"));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(cancelled.Cancel());
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(cancelled.Join().status.error_code(), grpc::StatusCode::CANCELLED);
  // The next exact decode needs both ranks: it runs at once and is right,
  // so the peer stopped too and the ranks are in step.
  const DecodeOutcome next = Decode(server->stub(), FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"),
                                                                   v1::OUTPUT_FLOAT32, v1::MODE_EXACT));
  ExpectMatches(next, SmallExpected(), v1::OUTPUT_FLOAT32);
  EXPECT_EQ(next.output.header().degree(), 2);
  // Without the stop: about 4 × reference - 0.3 s.
  EXPECT_LT(absl::Now() - t0, 1.5 * reference);
  // Same processes, no rebuild.
  EXPECT_EQ(server->Workers().size(), 2u);
  for (const WorkerProcess& w : *workers) EXPECT_EQ(Rank(*server, w.rank).pid, w.pid);
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_worker_restarts_total", {"group=\"g0\""}), 0);
  EXPECT_EQ(MetricValue(*m, "vaedecode_requests_total", {"status=\"CANCELLED\""}), 1);
}

TEST(ServiceSupervisionTest, KilledPeerFailsOnlyItsRequestThenTheGroupIsRebuilt) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::vector<WorkerProcess>> workers = server->WaitWorkers(2, absl::Seconds(10));
  ASSERT_TRUE(workers.ok()) << workers.status();
  const WorkerProcess peer = Rank(*server, 1);
  ASSERT_GT(peer.pid, 0);
  BackgroundDecode killed(*server, Slow(kLong, "victim"));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
  const DecodeOutcome& out = killed.Join();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr(absl::StrCat("rank 1 (pid ", peer.pid)));
  EXPECT_THAT(out.status.error_message(), HasSubstr("signal 9"));
  // The model's health went NOT_SERVING and comes back once rebuilt.
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "sd_kl").value_or(true), false);
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  EXPECT_TRUE(server->WaitWorkers(2, absl::Seconds(10), peer.group).ok());
  ExpectMatches(Decode(server->stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 1));
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"UNAVAILABLE\""}, 1));
}

TEST(ServiceSupervisionTest, LeaderCrashFailsItsRequestNamingRankZeroAndQueuedRequestsSurvive) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(1, absl::Seconds(10)).ok());
  const WorkerProcess leader = Rank(*server, 0);
  ASSERT_GT(leader.pid, 0);

  BackgroundDecode victim(*server, Slow(kLong, "victim"));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  BackgroundDecode queued(*server, Small("queued-before-the-crash"));
  ExpectReached(server->WaitMetric("vaedecode_queue_depth", {}, 1));
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_EQ(kill(leader.pid, SIGKILL), 0);
  const DecodeOutcome& out = victim.Join();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr(absl::StrCat("rank 0 (pid ", leader.pid)));
  EXPECT_THAT(out.status.error_message(), HasSubstr("signal 9"));
  EXPECT_THAT(out.status.error_message(), HasSubstr("rebuilt"));
  // Sent during the rebuild: it waits in the queue and succeeds.
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "sd_kl").value_or(true), false);
  const DecodeOutcome during = Decode(server->stub(), Small("sent-during-the-rebuild"));
  ExpectMatches(during, SmallExpected(), v1::OUTPUT_FLOAT32);
  ExpectMatches(queued.Join(), SmallExpected(), v1::OUTPUT_FLOAT32);
  // A new incarnation replaced the dead one.
  absl::StatusOr<std::vector<WorkerProcess>> rebuilt = server->WaitWorkers(1, absl::Seconds(10), leader.group);
  EXPECT_TRUE(rebuilt.ok()) << rebuilt.status();
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 1));
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"UNAVAILABLE\""}, 1));
  ExpectReached(server->WaitMetric("vaedecode_requests_total", {"status=\"OK\""}, 2));
}

TEST(ServiceSupervisionTest, FailedStartsKeepRetryingAndHealthSaysNotServing) {
  // A model folder whose weights are missing (a half-copied model): every
  // worker start fails until they arrive.
  const std::string repo = TempDir("half-copied");
  const std::string model_dir = repo + "/sd_kl";
  std::filesystem::create_directories(model_dir);
  std::filesystem::copy_file(FixturePath("sd_kl/config.json"), model_dir + "/config.json");
  absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(RealWorkerFlags(repo, "cpu:1", 1));
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;

  // Two failed starts retried (the third is on its way).
  ExpectReached(server.WaitMetric(
      "vaedecode_worker_restarts_total", {"group=\"g0\""}, [](double v) { return v >= 2; }, absl::Seconds(60)));
  EXPECT_EQ(server.Serving(std::string(kModelHealth) + "sd_kl").value_or(true), false);
  EXPECT_EQ(server.Serving("").value_or(true), false);
  absl::StatusOr<std::string> m = server.ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_group_ready", {"group=\"g0\""}), 0);
  const DecodeOutcome out = Decode(server.stub(), Small());
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr("still loading"));
  grpc::ClientContext ctx;
  v1::ListModelsResponse models;
  ASSERT_TRUE(server.stub().ListModels(&ctx, {}, &models).ok());
  EXPECT_EQ(models.models_size(), 0);

  // The weights arrive: a later start succeeds and the model serves.
  std::filesystem::create_symlink(FixturePath("sd_kl/diffusion_pytorch_model.safetensors"),
                                  model_dir + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(server.WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(90)).ok());
  EXPECT_EQ(server.Serving("").value_or(false), true);
  ExpectMatches(Decode(server.stub(), Small()), SmallExpected(), v1::OUTPUT_FLOAT32);
}

TEST(ServiceSupervisionTest, ConnectionsAreClosedAtTheirMaximumAgeAndClientsReconnect) {
  // So that an L4 load balancer sees long-lived clients reconnect and
  // spreads them over new replicas.
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(
      RealWorkerFlags(repo, "cpu:1", 1, {"--max_connection_age_s=1", "--max_connection_age_grace_s=1"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  std::shared_ptr<grpc::Channel> channel = server->channel();
  ExpectMatches(Decode(server->stub(), Small("before-the-age")), SmallExpected(), v1::OUTPUT_FLOAT32);
  // The server's GOAWAY (age 1 s, ±10% jitter, + 1 s grace) leaves the
  // channel idle; with the default age (300 s) it would stay READY for the
  // whole wait, so this fails without --max_connection_age_s.
  bool closed = false;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!closed && absl::Now() < give_up) {
    closed = channel->GetState(false) != GRPC_CHANNEL_READY;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(closed) << "the connection outlived --max_connection_age_s=1";
  ExpectMatches(Decode(server->stub(), Small("after-the-age")), SmallExpected(), v1::OUTPUT_FLOAT32);
}

TEST(ServiceSupervisionTest, SigtermDrainsInFlightAndQueuedThenExitsZero) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1, {"--drain_timeout_s=60"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  BackgroundDecode running(*server, Slow(kReference, "draining"));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  BackgroundDecode queued(*server, Small("queued-before-sigterm"));
  ExpectReached(server->WaitMetric("vaedecode_queue_depth", {}, 1));
  ExpectReached(server->WaitMetric("vaedecode_pending_request_count", {"model=\"sd_kl\""}, 1));
  server->Signal(SIGTERM);
  EXPECT_TRUE(server->WaitServing("", false, absl::Seconds(5)).ok());
  EXPECT_EQ(server->Serving(std::string(kModelHealth) + "sd_kl").value_or(true), false);
  const DecodeOutcome refused = Decode(server->stub(), Small());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));
  ExpectOk(running.Join());
  ExpectMatches(queued.Join(), SmallExpected(), v1::OUTPUT_FLOAT32);
  absl::StatusOr<int> code = server->WaitExit(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(server->Workers().empty());
}

TEST(ServiceSupervisionTest, DrainTimeoutCancelsWhatIsLeft) {
  // The embedded default model: [1, 4, 48, 48] decodes for seconds.
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1, {"--drain_timeout_s=1"}), {"default"});
  ASSERT_NE(server, nullptr);
  const absl::Time start = absl::Now();
  BackgroundDecode running(*server, SyntheticRequest("default", {1, 4, 48, 48}, "cut-by-drain"));
  ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
  const absl::Time sigterm = absl::Now();
  server->Signal(SIGTERM);
  absl::StatusOr<int> code = server->WaitExit(absl::Seconds(30));
  const absl::Time exited = absl::Now();
  const DecodeOutcome& out = running.Join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3) << "the exit code says the drain cut calls";
  // The server's own message, not gRPC's "Cancelling all calls": UNAVAILABLE, retry elsewhere.
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
  EXPECT_THAT(out.status.error_message(), HasSubstr("drain timeout (1s) cut this call"));
  EXPECT_EQ(out.messages, 0);
  EXPECT_TRUE(server->Workers().empty());
  // The drain waited its second, then cut the call, not the rest of the decode.
  EXPECT_GE(exited - sigterm, absl::Seconds(1));
  EXPECT_LT(exited - sigterm, absl::Seconds(4)) << "the call had run for " << sigterm - start;
}

}  // namespace
}  // namespace vaedecode::testing
