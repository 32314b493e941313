// Reliability on the real server with real workers (loopback, CPU Gloo
// groups): no stuck process holds a group, and client-supplied strings
// cannot forge log lines. Each test fails on a server without the fix it
// names.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/attacks.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// A decode of several seconds on sd_kl (about 10 ms per [4, 16, 16] latent).
v1::DecodeRequest Long(const std::string& id) { return SyntheticRequest("sd_kl", {512, 4, 16, 16}, id); }

v1::DecodeRequest Small(const std::string& id = "") {
  v1::DecodeRequest r = FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"));
  r.set_request_id(id);
  return r;
}

void ExpectReached(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Without heartbeats a SIGSTOPped rank is found only by the collective
// timeout (300 s here): the request would run into its client's deadline.
TEST(ReliabilityTest, AStoppedRankIsFoundWithinSecondsAndTheGroupIsRebuilt) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(
      RealWorkerFlags(repo, "cpu:2", 2, {"--heartbeat_timeout_s=2", "--collective_timeout_s=300"}), {"sd_kl"});
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
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 1));
  ExpectOk(Decode(server->stub(), Small()));

  // An idle leader stops: health goes NOT_SERVING and the group is rebuilt
  // on its own; a request sent meanwhile is answered, not left hanging.
  absl::StatusOr<std::vector<WorkerProcess>> rebuilt = server->WaitWorkers(2, absl::Seconds(10), peer.group);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  const WorkerProcess leader = Rank(*server, 0);
  ASSERT_GT(leader.pid, 0);
  ASSERT_EQ(kill(leader.pid, SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  const DecodeOutcome during = Decode(server->stub(), Small("while-the-leader-is-stopped"), absl::Seconds(120));
  EXPECT_TRUE(during.status.ok() || during.status.error_code() == grpc::StatusCode::UNAVAILABLE)
      << during.status.error_message();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(30));
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 2, absl::Seconds(30)));
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  ExpectOk(Decode(server->stub(), Small()));
  EXPECT_THAT(server->Log(), HasSubstr("stopped answering: no heartbeat for"));
}

// A dense decode on a group of two runs on the leader while the peer waits
// for the job's end; cancelled (or out of memory), the leader used to leave
// the peer waiting, and the next job hung until the collective timeout.
TEST(ReliabilityTest, ACancelledDenseDecodeOnAGroupLeavesItInStep) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2, {"--collective_timeout_s=300"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const std::vector<WorkerProcess> before = server->Workers();
  for (int i = 0; i < 2; ++i) {
    v1::DecodeRequest dense = Long(absl::StrCat("dense-", i));
    dense.set_mode(v1::MODE_DENSE);
    BackgroundDecode cancelled(*server, dense);
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(cancelled.Cancel());
    EXPECT_EQ(cancelled.Join().status.error_code(), grpc::StatusCode::CANCELLED);
    // EXACT needs both ranks: answered at once, and right.
    const absl::Time t0 = absl::Now();
    const DecodeOutcome next =
        Decode(server->stub(),
               FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"), v1::OUTPUT_FLOAT32, v1::MODE_EXACT),
               absl::Seconds(30));
    ExpectMatches(next, ReadFloat(FixturePath("sd_kl/expected.safetensors")), v1::OUTPUT_FLOAT32);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  }
  // The same processes: nothing was rebuilt.
  EXPECT_EQ(server->Workers().size(), before.size());
  for (const WorkerProcess& w : before) EXPECT_EQ(Rank(*server, w.rank).pid, w.pid);
}

// A leader still busy after its request was cancelled (here: stopped, with
// heartbeats off, as one long op would keep it) takes its group out of
// rotation after 5 s: health (the model's and the server's)
// says NOT_SERVING
// (before, SERVING throughout, and after 30 s new requests went to the busy
// leader), and past --cancel_release_timeout_s the group is rebuilt.
TEST(ReliabilityTest, AGroupWhoseLeaderIsBusyAfterACancelIsOutOfRotationThenRebuilt) {
  auto server = StartServing(
      RealWorkerFlags("", "cpu:1", 1, {"--heartbeat_timeout_s=0", "--cancel_release_timeout_s=10"}), {"default"});
  ASSERT_NE(server, nullptr);
  const WorkerProcess leader = Rank(*server, 0);
  ASSERT_GT(leader.pid, 0);
  v1::DecodeRequest long_request = SyntheticRequest("default", {64, 4, 32, 32}, "cancelled");
  {
    BackgroundDecode cancelled(*server, long_request, absl::Seconds(120));
    ExpectReached(server->WaitMetric("vaedecode_in_flight", {}, 1));
    ASSERT_EQ(kill(leader.pid, SIGSTOP), 0);
    ASSERT_TRUE(cancelled.Cancel());
    EXPECT_EQ(cancelled.Join().status.error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(server->WaitServing(std::string(kModelHealth) + "default", false, absl::Seconds(9)).ok());
  EXPECT_TRUE(server->WaitServing("", false, absl::Seconds(1)).ok());
  ExpectReached(server->WaitMetric("vaedecode_group_ready", {"group=\"g0\""}, 0, absl::Seconds(1)));
  // Past the bound: rebuilt, serving again, and decoding.
  ExpectReached(server->WaitMetric("vaedecode_worker_restarts_total", {"group=\"g0\""}, 1, absl::Seconds(30)));
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "default", true, absl::Seconds(60)).ok());
  v1::DecodeRequest small = Small("after");
  small.set_model("default");
  ExpectOk(Decode(server->stub(), small));
  EXPECT_THAT(server->Log(), HasSubstr("event=busy_after_cancel request_id=cancelled action=out_of_rotation"));
  EXPECT_THAT(server->Log(), HasSubstr("the leader was still busy 10 s after request cancelled was cancelled"));
}

// With the default limits, the 1024 x 1024 latent (one attention
// call over a million positions: 17 minutes of a CPU group) is refused at
// admission, naming the flag; a 512 x 512 one is admitted.
TEST(ReliabilityTest, TheDefaultLimitsRefuseAnAttentionThatWouldHoldAGroupForMinutes) {
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1), {"default"});
  ASSERT_NE(server, nullptr);
  const DecodeOutcome refused = Decode(server->stub(), SyntheticRequest("default", {1, 4, 1024, 1024}));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("1024 x 1024 = 1048576 latent positions"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("--max_attention_tokens"));
  // Admitted (and cancelled by its deadline: only its admission matters here).
  const DecodeOutcome admitted =
      Decode(server->stub(), SyntheticRequest("default", {1, 4, 512, 512}), absl::Milliseconds(1500));
  EXPECT_EQ(admitted.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << admitted.status.error_message();
}

// Sets $HOME to a folder of its own while it lives: the workers cache their
// calibration profiles under $HOME, and a doctored one must not reach the
// tests after the one that made it.
class ScopedHome {
 public:
  explicit ScopedHome(const std::string& home) : home_(home) {
    const char* old = std::getenv("HOME");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("HOME", home.c_str(), 1);
  }
  ~ScopedHome() { had_ ? setenv("HOME", old_.c_str(), 1) : unsetenv("HOME"); }
  const std::string& home() const { return home_; }

 private:
  std::string home_, old_;
  bool had_ = false;
};

// Starts the server once with `flags` so that its workers calibrate sd_kl,
// then divides every peak of the cached profile by 100: the scheduler then
// predicts a decode to fit that really runs out of the memory budget.
void MakeTheSchedulerMispredict(const ScopedHome& home, const std::vector<std::string>& flags) {
  {
    auto calibrating = StartServing(flags, {"sd_kl"});
    ASSERT_NE(calibrating, nullptr);
  }
  const std::string dir = home.home() + "/.cache/vaedecode/profiles";
  int doctored = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string text = ReadText(entry.path().string());
    for (const char* field : {"\"bytes_per_latent\": ", "\"fixed_bytes\": ", "\"attention_fixed_bytes\": ",
                              "\"attention_bytes_per_latent\": ", "\"attention_bytes_per_latent_pair\": "}) {
      const size_t at = text.find(field);
      ASSERT_NE(at, std::string::npos) << field;
      const size_t begin = at + std::strlen(field), end = text.find_first_of(",\n}", begin);
      const double value = std::stod(text.substr(begin, end - begin));
      text.replace(begin, end - begin, absl::StrCat(value / 100));
    }
    std::ofstream(entry.path()) << text;
    ++doctored;
  }
  ASSERT_EQ(doctored, 1);
}

// A real out-of-memory on a group of one: the worker answers
// RESOURCE_EXHAUSTED and serves on, same process (before, the group was torn
// down and rebuilt).
TEST(ReliabilityTest, AnOutOfMemoryIsAnsweredInPlace) {
  const ScopedHome home(TempDir("home"));
  const std::string repo = FixtureRepository({"sd_kl"});
  const std::vector<std::string> flags = RealWorkerFlags(repo, "cpu:1", 1, {"--memory_budget_mib=64"});
  ASSERT_NO_FATAL_FAILURE(MakeTheSchedulerMispredict(home, flags));

  auto server = StartServing(flags, {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(1, absl::Seconds(10)).ok());
  const WorkerProcess leader = Rank(*server, 0);
  // About 170 MB of activations against a 64 MiB budget, predicted to fit.
  const DecodeOutcome oom = Decode(server->stub(), SyntheticRequest("sd_kl", {8, 4, 64, 64}, "too-big"));
  EXPECT_EQ(oom.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << oom.status.error_message();
  EXPECT_THAT(oom.status.error_message(), HasSubstr("out of memory"));
  ExpectMatches(Decode(server->stub(), Small("after-the-oom")), ReadFloat(FixturePath("sd_kl/expected.safetensors")),
                v1::OUTPUT_FLOAT32);
  EXPECT_EQ(Rank(*server, 0).pid, leader.pid);
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_worker_restarts_total", {"group=\"g0\""}), 0);
}

// A real out-of-memory inside an exact decode on a group of two: the ranks
// are blocked in exchanges with each other when one runs out, so the
// communicator is aborted; they re-form it in place, the leader answers
// RESOURCE_EXHAUSTED, and the same processes decode the next request
// exactly (before, the group was torn down, restarted and its models
// reloaded). Twice, so a re-formed group recovers again.
TEST(ReliabilityTest, AnOutOfMemoryInAnExactDecodeOnAGroupIsAnsweredInPlace) {
  const ScopedHome home(TempDir("home-exact"));
  const std::string repo = FixtureRepository({"sd_kl"});
  const std::vector<std::string> flags =
      RealWorkerFlags(repo, "cpu:2", 2, {"--memory_budget_mib=64", "--collective_timeout_s=120"});
  ASSERT_NO_FATAL_FAILURE(MakeTheSchedulerMispredict(home, flags));

  auto server = StartServing(flags, {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->WaitWorkers(2, absl::Seconds(10)).ok());
  const std::vector<WorkerProcess> before = server->Workers();
  for (int i = 0; i < 2; ++i) {
    // Each rank's band needs about 85 MB against its 64 MiB budget.
    v1::DecodeRequest big = SyntheticRequest("sd_kl", {8, 4, 64, 64}, absl::StrCat("too-big-", i));
    big.set_mode(v1::MODE_EXACT);
    const DecodeOutcome oom = Decode(server->stub(), big, absl::Seconds(120));
    EXPECT_EQ(oom.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << oom.status.error_message();
    EXPECT_THAT(oom.status.error_message(), HasSubstr("out of memory"));
    EXPECT_THAT(oom.status.error_message(), HasSubstr("recovered in place"));
    const DecodeOutcome next =
        Decode(server->stub(),
               FixtureRequest("sd_kl", FixturePath("sd_kl/latent.safetensors"), v1::OUTPUT_FLOAT32, v1::MODE_EXACT),
               absl::Seconds(60));
    ExpectMatches(next, ReadFloat(FixturePath("sd_kl/expected.safetensors")), v1::OUTPUT_FLOAT32);
    EXPECT_EQ(next.output.header().mode(), v1::MODE_EXACT);
  }
  EXPECT_EQ(server->Workers().size(), before.size());
  for (const WorkerProcess& w : before) EXPECT_EQ(Rank(*server, w.rank).pid, w.pid);
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_worker_restarts_total", {"group=\"g0\""}), 0);
  EXPECT_THAT(server->Log(), HasSubstr("re-formed in place after rank"));
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
  auto server =
      StartServing(RealWorkerFlags(repo, "cpu:1", 1, {"--stream_stall_timeout_s=2", "--chunk_bytes=65536"}), {"sd_kl"});
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

// A reader that keeps every write under the stall timeout, but is slow in
// all, is cancelled once its output has waited --stream_read_timeout_s for
// it; before, three such clients held the only group 93 s.
TEST(ReliabilityTest, ASteadySlowReaderIsCancelledOnceItsOutputWaitedTooLongInAll) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1,
                                             {"--stream_stall_timeout_s=2", "--stream_read_timeout_s=3",
                                              "--chunk_bytes=65536", "--max_call_output_mib=1"}),
                             {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const std::unique_ptr<v1::VaeDecoder::Stub> slow = server->SlowReaderStub();
  // 12.6 MB in 64 KiB chunks, one read every 0.5 s: no write waits 2 s, all
  // of them together pass 3 s after a few dozen chunks.
  const DecodeOutcome out = Decode(*slow, SyntheticRequest("sd_kl", {64, 4, 16, 16}, "slow-reader"), absl::Seconds(120),
                                   [&](int, grpc::ClientContext&) { absl::SleepFor(absl::Milliseconds(500)); });
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::CANCELLED) << out.status.error_message();
  EXPECT_LT(out.messages, 150);  // of about 200
  ExpectReached(server->WaitMetric("vaedecode_stalled_streams_total", {}, 1, absl::Seconds(10)));
  EXPECT_THAT(server->Log(), HasSubstr("the client read too slowly"));
  ExpectOk(Decode(server->stub(), Small("after-the-slow-reader")));
}

TEST(ReliabilityTest, AdmissionRefusesCostlyNonFiniteAndOversizedRequestsAndKeepsServing) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(
      RealWorkerFlags(repo, "cpu:1", 1,
                      {"--max_output_pixels=0,sd_kl=100000", "--max_message_bytes=1048576", "--chunk_bytes=65536"}),
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
  ExpectReached(
      server->WaitMetric("vaedecode_rejected_requests_total", {"reason=\"message_too_large\""}, 1, absl::Seconds(5)));
  ExpectMatches(Decode(server->stub(), Small()), ReadFloat(FixturePath("sd_kl/expected.safetensors")),
                v1::OUTPUT_FLOAT32);
}

// The names of the files a reflection answer carries, or its error as a
// status (v1 or v1alpha: the same messages in two packages).
template <typename Reflection, typename Request, typename Response>
absl::StatusOr<std::vector<std::string>> AskReflection(const std::shared_ptr<grpc::Channel>& channel,
                                                       const Request& request) {
  auto stub = Reflection::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&ctx);
  stream->Write(request);
  stream->WritesDone();
  Response response;
  std::vector<std::string> names;
  absl::Status error;
  while (stream->Read(&response)) {
    if (response.has_error_response()) {
      error = absl::Status(static_cast<absl::StatusCode>(response.error_response().error_code()),
                           response.error_response().error_message());
    }
    for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      file.ParseFromString(bytes);
      names.push_back(file.name());
    }
  }
  const grpc::Status s = stream->Finish();
  if (!s.ok()) return absl::UnknownError(s.error_message());
  if (!error.ok()) return error;
  return names;
}

template <typename Reflection, typename Request, typename Response>
void ExpectPublicReflectionOnly(const std::shared_ptr<grpc::Channel>& channel) {
  const auto ask = [&channel](const Request& r) { return AskReflection<Reflection, Request, Response>(channel, r); };
  Request list;
  list.set_list_services("");
  absl::StatusOr<std::vector<std::string>> services = ask(list);
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services, ::testing::UnorderedElementsAre("vaedecode.v1.VaeDecoder", "inference.GRPCInferenceService",
                                                         "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                                                         "grpc.reflection.v1alpha.ServerReflection"));
  for (const char* symbol : {"vaedecode.v1.VaeDecoder", "vaedecode.v1.DecodeRequest", "grpc.health.v1.Health",
                             "inference.GRPCInferenceService", "inference.ModelInferRequest"}) {
    Request by_symbol;
    by_symbol.set_file_containing_symbol(symbol);
    absl::StatusOr<std::vector<std::string>> files = ask(by_symbol);
    ASSERT_TRUE(files.ok()) << symbol << ": " << files.status();
    EXPECT_FALSE(files->empty()) << symbol;
  }
  Request file;
  file.set_file_by_filename("vaedecode/v1/vaedecode.proto");
  EXPECT_THAT(ask(file).value_or(std::vector<std::string>{}), ::testing::Contains("vaedecode/v1/vaedecode.proto"));
  // The server<->worker protocol is linked into the server, never described.
  Request internal_symbol;
  internal_symbol.set_file_containing_symbol("vaedecode.internal.GroupLeader");
  EXPECT_EQ(ask(internal_symbol).status().code(), absl::StatusCode::kNotFound);
  Request internal_file;
  internal_file.set_file_by_filename("vaedecode/internal/worker.proto");
  EXPECT_EQ(ask(internal_file).status().code(), absl::StatusCode::kNotFound);
}

TEST(ReliabilityTest, ReflectionAnswersV1AndV1AlphaAboutThePublicApiOnly) {
  const std::string repo = FixtureRepository({"sd_kl"});
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  ExpectPublicReflectionOnly<grpc::reflection::v1::ServerReflection, grpc::reflection::v1::ServerReflectionRequest,
                             grpc::reflection::v1::ServerReflectionResponse>(server->channel());
  ExpectPublicReflectionOnly<grpc::reflection::v1alpha::ServerReflection,
                             grpc::reflection::v1alpha::ServerReflectionRequest,
                             grpc::reflection::v1alpha::ServerReflectionResponse>(server->channel());
}

// A CA, a server certificate for 127.0.0.1 and a client certificate, made
// with Debian's openssl in `dir`.
void MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd '", dir, "'; ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem 2>/dev/null; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext "
      "-out server.pem 2>/dev/null; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out client.csr 2>/dev/null; ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem "
      "2>/dev/null");
  ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed (tools/setup.sh installs it)";
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& dir, bool client_cert) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadText(dir + "/ca.pem");
  if (client_cert) {
    ssl.pem_private_key = ReadText(dir + "/client.key");
    ssl.pem_cert_chain = ReadText(dir + "/client.pem");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel: no reuse across tests
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

TEST(ReliabilityTest, MutualTlsOnTheGrpcPort) {
  const std::string certs = TempDir("certs");
  MakeCertificates(certs);
  const std::string repo = FixtureRepository({"sd_kl"});
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(RealWorkerFlags(
      repo, "cpu:1", 1,
      {absl::StrCat("--tls_cert=", certs, "/server.pem"), absl::StrCat("--tls_key=", certs, "/server.key"),
       absl::StrCat("--tls_client_ca=", certs, "/ca.pem")}));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  const std::shared_ptr<grpc::Channel> tls = TlsChannel(address, certs, true);
  auto health = grpc::health::v1::Health::NewStub(tls);
  bool serving = false;
  for (int i = 0; i < 600 && !serving; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(std::string(kModelHealth) + "sd_kl");
    grpc::health::v1::HealthCheckResponse response;
    serving = health->Check(&ctx, request, &response).ok() &&
              response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (!serving) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(serving) << "sd_kl never SERVING over TLS";
  auto stub = v1::VaeDecoder::NewStub(tls);
  ExpectMatches(Decode(*stub, Small("over-tls")), ReadFloat(FixturePath("sd_kl/expected.safetensors")),
                v1::OUTPUT_FLOAT32);

  // Without a client certificate, or in plaintext: no call gets through.
  auto anonymous = v1::VaeDecoder::NewStub(TlsChannel(address, certs, false));
  EXPECT_EQ(Decode(*anonymous, Small(), absl::Seconds(5)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Decode((*server)->stub(), Small(), absl::Seconds(5)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  // The server still serves the authenticated client, and the client binary
  // speaks mutual TLS too.
  ExpectOk(Decode(*stub, Small("after-refusals")));
  const std::string out = TempDir("tls-client") + "/sample.npy";
  const CommandResult client = RunCommand(
      absl::StrCat(Runfile("client/vaedecode_client"), " --server=", address, " --model=sd_kl",
                   " --latent=", FixturePath("sd_kl/latent.safetensors"), " --out=", out, " --tls_ca=", certs,
                   "/ca.pem --tls_cert=", certs, "/client.pem --tls_key=", certs, "/client.key"));
  EXPECT_EQ(client.status, 0) << client.output;
  EXPECT_TRUE(std::filesystem::exists(out)) << client.output;
}

TEST(ReliabilityTest, TlsFlagsAreCheckedAtStart) {
  const std::string dir = TempDir("bad-certs");
  { std::ofstream(dir + "/not.pem") << "hello"; }
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{absl::StrCat("--tls_cert=", dir, "/not.pem")},
        std::vector<std::string>{absl::StrCat("--tls_cert=", dir, "/not.pem"),
                                 absl::StrCat("--tls_key=", dir, "/not.pem")},
        std::vector<std::string>{absl::StrCat("--tls_client_ca=", dir, "/not.pem")}}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(flags);
    ASSERT_FALSE(server.ok());
    EXPECT_THAT(server.status().message(), HasSubstr("--tls_")) << server.status();
  }
}

// Slow connections on the metrics port (headers sent a line a second, more
// of them than it has threads) cannot stop scrapes: requests are cut after
// 5 s. Before, four such connections blocked every scrape (civetweb's two
// threads and 30 s), blinding alerts exactly during an attack.
TEST(ReliabilityTest, SlowConnectionsCannotBlindTheMetricsPort) {
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1), {"default"});
  ASSERT_NE(server, nullptr);
  std::atomic<bool> stop{false};
  std::vector<std::thread> slow;
  for (int i = 0; i < 24; ++i) {
    slow.emplace_back([&] {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(server->metrics_port());
      inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        const std::string start = "GET /metrics HTTP/1.1\r\n";
        bool open = write(fd, start.data(), start.size()) > 0;
        for (int s = 0; open && !stop && s < 60; ++s) {
          absl::SleepFor(absl::Seconds(1));
          open = send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL) > 0;
        }
      }
      close(fd);
    });
  }
  absl::SleepFor(absl::Seconds(1));
  absl::StatusOr<std::string> scrape = server->ScrapeMetrics();
  EXPECT_TRUE(scrape.ok()) << scrape.status();
  stop = true;
  for (std::thread& t : slow) t.join();
}

// A gzip-compressed request is refused, naming the algorithm, before it is
// inflated (1 MiB of zeros would be 2 GB); the server keeps serving.
TEST(ReliabilityTest, CompressedRequestsAreRefusedBeforeTheyInflate) {
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1), {"default"});
  ASSERT_NE(server, nullptr);
  v1::DecodeRequest request = Small("gzip");
  request.set_model("default");
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  ctx.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  auto reader = server->stub().Decode(&ctx, request);
  v1::DecodeResponse message;
  int messages = 0;
  while (reader->Read(&message)) ++messages;
  const grpc::Status gzip = reader->Finish();
  EXPECT_EQ(messages, 0);
  EXPECT_EQ(gzip.error_code(), grpc::StatusCode::UNIMPLEMENTED) << gzip.error_message();
  EXPECT_THAT(gzip.error_message(), HasSubstr("gzip"));
  request.set_request_id("plain");
  ExpectOk(Decode(server->stub(), request));
}

int64_t RssBytes(pid_t pid) {
  std::istringstream status(ReadText(absl::StrCat("/proc/", pid, "/status")));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) return std::stoll(line.substr(6)) << 10;
  }
  return 0;
}

// Uploads that stall before their message is complete are held within
// --grpc_memory_mib: past it gRPC resets them RESOURCE_EXHAUSTED (before,
// 20 stalled 60 MiB uploads held 1.1 GB and nothing was reset), and a
// well-behaved client decodes meanwhile. None reaches a handler, so they
// are counted by vaedecode_grpc_calls_total (before, by no metric).
TEST(ReliabilityTest, StalledUploadsAreHeldWithinTheGrpcMemoryQuota) {
  constexpr int kUploads = 12;
  constexpr int64_t kQuotaMib = 32;
  auto server = StartServing(
      RealWorkerFlags("", "cpu:1", 1, {"--max_message_bytes=16777216", absl::StrCat("--grpc_memory_mib=", kQuotaMib)}),
      {"default"});
  ASSERT_NE(server, nullptr);
  // 7.5 MiB latents of which 7 MiB arrive: 84 MiB held without a bound.
  StallingProxy proxy(server->port(), size_t{7} << 20);
  const int64_t rss_before = RssBytes(server->pid());
  v1::DecodeRequest big = SyntheticRequest("default", {1, 4, 512, 960}, "stalled");
  std::vector<grpc::Status> results(kUploads);
  std::vector<std::thread> uploads;
  for (int i = 0; i < kUploads; ++i) {
    uploads.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetMaxSendMessageSize(64 << 20);
      auto stub = v1::VaeDecoder::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", proxy.port()),
                                                                    grpc::InsecureChannelCredentials(), args));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      auto reader = stub->Decode(&ctx, big);
      v1::DecodeResponse message;
      while (reader->Read(&message)) {
      }
      results[i] = reader->Finish();
    });
  }
  absl::SleepFor(absl::Seconds(5));
  const int64_t held = RssBytes(server->pid()) - rss_before;
  v1::DecodeRequest good = Small("meanwhile");
  good.set_model("default");
  ExpectOk(Decode(server->stub(), good));
  for (std::thread& t : uploads) t.join();
  int reset = 0;
  for (const grpc::Status& r : results) {
    EXPECT_NE(r.error_code(), grpc::StatusCode::OK);
    if (r.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++reset;
  }
  // Past the quota gRPC resets streams or holds their reads back until
  // memory frees (how many of each depends on timing: 5 to 12 of the 12
  // were reset); what it guarantees is the bound. Without a quota none is
  // reset and all 84 MiB are held.
  EXPECT_GE(reset, 1) << "uploads reset by the quota";
  EXPECT_LT(held, (kQuotaMib + 48) << 20) << "server memory while the uploads stalled";
  // No handler saw them (reset, or past their deadline before their message
  // was whole): only gRPC's own counts have them.
  ExpectReached(server->WaitMetric("vaedecode_grpc_calls_total", {"outcome=\"failed\""},
                                   [](double failed) { return failed >= 1; }));
  EXPECT_THAT(server->Log(), ::testing::Not(HasSubstr("id=stalled")));
  good.set_request_id("after");
  ExpectOk(Decode(server->stub(), good));
}

// An upload still arriving after --upload_timeout_s has its connection
// closed (UNAVAILABLE), counted and logged, while a decode that runs longer
// than that on another connection is untouched; before, a stalled upload
// was held until its client's deadline (here 60 s) or forever.
TEST(ReliabilityTest, AnUploadThatTakesTooLongIsCut) {
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1, {"--upload_timeout_s=2"}), {"default"});
  ASSERT_NE(server, nullptr);
  BackgroundDecode long_decode(*server, SyntheticRequest("default", {3, 4, 32, 32}, "long-decode"), absl::Seconds(120));
  StallingProxy proxy(server->port(), size_t{2} << 20);
  auto stub = v1::VaeDecoder::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", proxy.port()), grpc::InsecureChannelCredentials()));
  const DecodeOutcome stalled =
      Decode(*stub, SyntheticRequest("default", {1, 4, 512, 480}, "stalled-upload"), absl::Seconds(60));
  EXPECT_EQ(stalled.status.error_code(), grpc::StatusCode::UNAVAILABLE) << stalled.status.error_message();
  ExpectReached(server->WaitMetric("vaedecode_grpc_uploads_cut_total", {}, 1));
  EXPECT_THAT(server->Log(), HasSubstr("event=upload_timeout"));
  ExpectOk(long_decode.Join());
}

// The server raises its soft file-descriptor limit to the hard one at start
// (a soft 1024 ran out under 1000 idle connections, and gRPC 1.51's
// listener never accepted again).
TEST(ReliabilityTest, TheFileDescriptorLimitIsRaisedAtStart) {
  struct rlimit original;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max <= 256) GTEST_SKIP() << "the hard limit is " << original.rlim_max;
  struct rlimit low = original;
  low.rlim_cur = 256;  // inherited by the server
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1), {"default"});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &original), 0);
  ASSERT_NE(server, nullptr);
  std::ifstream limits(absl::StrCat("/proc/", server->pid(), "/limits"));
  std::string line;
  std::string files;
  while (std::getline(limits, line)) {
    if (absl::StartsWith(line, "Max open files")) files = line;
  }
  const std::string hard = original.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(original.rlim_max);
  EXPECT_THAT(files, ::testing::ContainsRegex(absl::StrCat("Max open files +", hard, " +", hard)));
}

// Once the server runs out of file descriptors, connections beyond are shed
// (closed at once) and the gRPC port serves again when descriptors are
// free; gRPC 1.51's own listener stopped accepting for good.
TEST(ReliabilityTest, TheGrpcPortRecoversAfterTheFileDescriptorsRanOut) {
  auto server = StartServing(RealWorkerFlags("", "cpu:1", 1), {"default"});
  ASSERT_NE(server, nullptr);
  const struct rlimit few = {200, 200};
  ASSERT_EQ(prlimit(server->pid(), RLIMIT_NOFILE, &few, nullptr), 0) << std::strerror(errno);
  const int port = server->port();
  std::vector<int> flood;
  for (int i = 0; i < 400; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    flood.push_back(fd);
  }
  absl::SleepFor(absl::Seconds(2));  // the server accepts what it can and sheds the rest
  for (int fd : flood) close(fd);
  v1::DecodeRequest small = Small("after-the-flood");
  small.set_model("default");
  DecodeOutcome out;
  for (int attempt = 0; attempt < 30; ++attempt) {  // until gRPC has closed the flood's connections
    auto stub = v1::VaeDecoder::NewStub(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    out = Decode(*stub, small, absl::Seconds(5));
    if (out.status.ok()) break;
    absl::SleepFor(absl::Seconds(1));
  }
  ExpectOk(out);
  EXPECT_THAT(server->Log(), HasSubstr("event=connection_shed"));
  ExpectReached(server->WaitMetric("vaedecode_grpc_connections_shed_total", {}, [](double shed) { return shed >= 1; }));
}

// A worker stuck on a model file (a hung mount; here a stand-in worker that
// waits to open a FIFO, as open() waits on a hung NFS server) is named with
// the file when its group's start times out; before, only the timeout was.
TEST(ReliabilityTest, AStartThatTimesOutNamesTheFileARankIsStuckOn) {
  const std::string dir = TempDir("hung_mount");
  const std::string fifo = dir + "/diffusion_pytorch_model.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string worker = dir + "/stuck_worker.sh";
  std::ofstream(worker) << "#!/bin/sh\nexec cat " << fifo << "\n";
  std::filesystem::permissions(worker, std::filesystem::perms::owner_all);
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      {absl::StrCat("--worker_binary=", worker), "--worker_start_timeout_s=2", "--heartbeat_timeout_s=0"});
  ASSERT_TRUE(server.ok()) << server.status();
  // As the log quotes it (escaped).
  const std::string want = absl::StrCat("waits in openat(\\\"", fifo, "\\\") (a hung mount?)");
  for (int i = 0; i < 100 && !absl::StrContains((*server)->Log(), want); ++i) absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT((*server)->Log(), HasSubstr(want));
}

// A --socket_dir the leaders cannot bind in is refused at start, by name;
// before, every group restarted forever.
TEST(ReliabilityTest, ABadSocketDirIsRefusedAtStart) {
  const std::string file = TempDir("socket-dir") + "/a_file";
  { std::ofstream(file) << "not a folder"; }
  const std::string too_long = TempDir("socket-dir") + "/" + std::string(80, 's');  // no room for a socket name
  std::filesystem::create_directories(too_long);
  for (const std::string& dir : {file, file + "/missing", too_long}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(RealWorkerFlags("", "cpu:1", 1, {absl::StrCat("--socket_dir=", dir)}));
    ASSERT_FALSE(server.ok());
    EXPECT_THAT(server.status().message(), HasSubstr(absl::StrCat("--socket_dir=", dir, ": "))) << server.status();
  }
}

// A second server on a port the first one holds fails to start instead of
// taking half its connections (SO_REUSEPORT, gRPC's and the HTTP library's
// default), on the gRPC and the HTTP port alike.
TEST(ReliabilityTest, ASecondServerCannotShareAPort) {
  auto first = StartServing(RealWorkerFlags("", "cpu:1", 1, {"--http_listen=127.0.0.1:0"}), {"default"});
  ASSERT_NE(first, nullptr);
  for (const std::string& flag :
       {absl::StrCat("--listen=", first->address()), absl::StrCat("--http_listen=127.0.0.1:", first->http_port())}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> second =
        ServerProcess::Start(RealWorkerFlags("", "cpu:1", 1, {"--http_listen=127.0.0.1:0", flag}));
    ASSERT_FALSE(second.ok()) << flag;
    EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("cannot listen on ", flag))) << second.status();
  }
  v1::DecodeRequest still = Small("the-first-still-serves");
  still.set_model("default");
  ExpectOk(Decode(first->stub(), still));
}

// The lines of `log` at warning or error: spdlog's "[warning]"/"[error]"
// and glog-style lines from c10d and gRPC ("W1201 …", "E1201 …").
std::vector<std::string> WarningsAndErrors(const std::string& log) {
  std::vector<std::string> found;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const bool spd = absl::StrContains(line, "] [warning] ") || absl::StrContains(line, "] [error] ") ||
                     absl::StrContains(line, "] [critical] ");
    const bool glog = line.size() > 5 && (line[0] == 'W' || line[0] == 'E' || line[0] == 'F') &&
                      std::all_of(line.begin() + 1, line.begin() + 5, [](char c) { return c >= '0' && c <= '9'; });
    const bool torch = absl::StartsWith(line, "[W") || absl::StartsWith(line, "[E");
    if (spd || glog || torch) found.emplace_back(line);
  }
  return found;
}

// Models that cannot load — a config that used to divide by zero in the
// worker (norm_num_groups 0), widths whose convolutions would take 36 TB,
// a folder that is a symlink loop, a dangling link — are unavailable by
// name (ListModels, the per-model health, the error of a request for them,
// a metric and one log line each say why), and so is an audio VAE (not
// served yet); sd_kl is served from the same
// repository. Before, the first killed every worker with SIGFPE and the
// server stayed NOT_SERVING without naming the model.
TEST(ReliabilityTest, ModelsThatCannotLoadAreUnavailableByNameAndTheOthersAreServed) {
  const ScopedHome home(TempDir("home"));
  const std::string repo = FixtureRepository({"sd_kl"});
  nlohmann::json config = nlohmann::json::parse(std::ifstream(FixturePath("sd_kl/config.json")));
  nlohmann::json zero_groups = config;
  zero_groups["norm_num_groups"] = 0;
  WriteModelFolder(repo + "/zero_groups", zero_groups, "sd_kl");
  nlohmann::json too_wide = config;
  too_wide["block_out_channels"] = std::vector<int64_t>(config["block_out_channels"].size(), int64_t{1} << 20);
  WriteModelFolder(repo + "/too_wide", too_wide, "sd_kl");
  std::filesystem::create_directory_symlink(repo + "/loop", repo + "/loop");
  std::filesystem::create_directory_symlink(repo + "/missing", repo + "/dangling");
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  absl::StatusOr<bool> serving = server->Serving("");
  EXPECT_TRUE(serving.ok() && *serving) << serving.status();
  ExpectMatches(Decode(server->stub(), Small("beside-bad-models")),
                ReadFloat(FixturePath("sd_kl/expected.safetensors")), v1::OUTPUT_FLOAT32);

  grpc::ClientContext ctx;
  v1::ListModelsResponse list;
  ASSERT_TRUE(server->stub().ListModels(&ctx, v1::ListModelsRequest(), &list).ok());
  ASSERT_EQ(list.models_size(), 1);
  EXPECT_EQ(list.models(0).name(), "sd_kl");
  std::map<std::string, std::string> reasons;
  for (const v1::UnavailableModel& m : list.unavailable()) reasons[m.name()] = m.reason();
  EXPECT_THAT(reasons["zero_groups"], HasSubstr("norm_num_groups"));
  EXPECT_THAT(reasons["too_wide"], HasSubstr("its weights allow"));
  EXPECT_THAT(reasons["loop"], HasSubstr("Too many levels of symbolic links"));
  EXPECT_THAT(reasons["dangling"], HasSubstr("No such file or directory"));
  EXPECT_EQ(reasons.size(), 4u);

  for (const auto& [name, reason] : reasons) {
    absl::StatusOr<bool> model_serving = server->Serving(kModelHealth + name);
    EXPECT_TRUE(model_serving.ok() && !*model_serving) << name << " " << model_serving.status();
    v1::DecodeRequest request = Small(absl::StrCat("for-", name));
    request.set_model(name);
    const DecodeOutcome refused = Decode(server->stub(), request, absl::Seconds(10));
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE) << name;
    EXPECT_THAT(refused.status.error_message(), HasSubstr(absl::StrCat("model \"", name, "\" failed to load: ")));
    EXPECT_THAT(server->Log(), HasSubstr(absl::StrCat("model=", name, " event=unavailable reason=")));
  }
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_model_load_failed", {"model=\"zero_groups\""}), 1);
  EXPECT_EQ(MetricValue(*m, "vaedecode_model_load_failed", {"model=\"sd_kl\""}), 0);
}

// A model folder removed while serving: once its group is rebuilt, requests
// for it fail UNAVAILABLE naming why — queued ones at once, not at their
// deadline — and the other model is served. The whole repository gone: the
// group cannot start, and every model's requests fail the same way until the
// folder is back. Before, both queued until their deadline (forever without
// one) while health said SERVING.
TEST(ReliabilityTest, RequestsForAModelWhoseFolderIsGoneFailAtOnce) {
  const ScopedHome home(TempDir("home"));
  const std::string repo = FixtureRepository({"sd_kl"});
  std::filesystem::create_directory_symlink(std::filesystem::absolute(FixturePath("sd_kl")), repo + "/extra");
  auto server = StartServing(RealWorkerFlags(repo, "cpu:1", 1), {"sd_kl", "extra"});
  ASSERT_NE(server, nullptr);
  v1::DecodeRequest extra = Small("extra");
  extra.set_model("extra");
  ExpectOk(Decode(server->stub(), extra));

  // The folder goes, then the worker: the rebuilt group no longer has it.
  std::filesystem::remove(repo + "/extra");
  ASSERT_TRUE(server->WaitWorkers(1, absl::Seconds(10)).ok());
  const WorkerProcess leader = Rank(*server, 0);
  ASSERT_EQ(kill(leader.pid, SIGKILL), 0);
  // Sent while the group rebuilds (queued), or after (refused at admission):
  // the same answer either way, long before the deadline.
  const DecodeOutcome gone = Decode(server->stub(), extra, absl::Seconds(300));
  EXPECT_EQ(gone.status.error_code(), grpc::StatusCode::UNAVAILABLE) << gone.status.error_message();
  EXPECT_THAT(gone.status.error_message(),
              HasSubstr("model \"extra\" failed to load: its folder is no longer in the model repository"));
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(60)).ok());
  absl::StatusOr<bool> extra_serving = server->Serving(std::string(kModelHealth) + "extra");
  EXPECT_TRUE(extra_serving.ok() && !*extra_serving) << extra_serving.status();
  ExpectOk(Decode(server->stub(), Small("after-the-removal")));

  // The whole repository goes.
  const std::string away = repo + ".away";
  std::filesystem::rename(repo, away);
  absl::StatusOr<std::vector<WorkerProcess>> workers = server->WaitWorkers(1, absl::Seconds(10));
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(kill(Rank(*server, 0).pid, SIGKILL), 0);
  const DecodeOutcome missing = Decode(server->stub(), Small("repository-missing"), absl::Seconds(300));
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::UNAVAILABLE) << missing.status.error_message();
  EXPECT_THAT(missing.status.error_message(),
              HasSubstr(absl::StrCat("model \"sd_kl\" failed to load: the model repository ", repo, " is missing")));
  absl::StatusOr<std::string> m = server->ScrapeMetrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MetricValue(*m, "vaedecode_model_load_failed", {"model=\"sd_kl\""}), 1);

  // Back: served again, at the group's next start.
  std::filesystem::rename(away, repo);
  ASSERT_TRUE(server->WaitServing(std::string(kModelHealth) + "sd_kl", true, absl::Seconds(90)).ok());
  ExpectOk(Decode(server->stub(), Small("repository-back")));
  ExpectReached(server->WaitMetric("vaedecode_model_load_failed", {"model=\"sd_kl\""}, 0));
}

// Starts of multi-rank groups and SIGTERM stops, several times over: none
// may print a warning or an error (c10d connect retries, a group reported
// broken by the shutdown's own order).
TEST(ReliabilityTest, CleanStartsAndStopsLogNoWarningOrError) {
  const std::string repo = FixtureRepository({"sd_kl"});
  for (int round = 0; round < 4; ++round) {
    auto server = StartServing(RealWorkerFlags(repo, "cpu:2", 2), {"sd_kl"});
    ASSERT_NE(server, nullptr);
    ExpectOk(Decode(server->stub(), Small(absl::StrCat("round-", round))));
    // A closed terminal's SIGHUP drains like SIGTERM (it used to kill).
    server->Signal(round == 3 ? SIGHUP : SIGTERM);
    absl::StatusOr<int> code = server->WaitExit(absl::Seconds(30));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
    const std::string log = server->Log();
    EXPECT_THAT(WarningsAndErrors(log), ::testing::IsEmpty()) << "round " << round;
    EXPECT_THAT(log, HasSubstr("event=exit code=0"));
  }
}

}  // namespace
}  // namespace vaedecode::testing
