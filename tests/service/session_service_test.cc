// DecodeSession through the service, end to end: a vaedecode_server process
// with a real two-rank vaedecode_worker group (Gloo on CPU) over the wan21
// fixture. A clip sent chunk by chunk comes back equal to the whole clip's
// Decode (dense: bit for bit; exact: within 3e-5) over several chunkings,
// batch 2 and uneven bands; a session survives a worker killed between its
// chunks (the rebuilt group replays its history) and one killed during a
// chunk; MiniMax-H3's windows stream, their held frames coming with the
// last chunk; both clients' session modes write the whole decode's clip;
// sessions interleave with
// each other and with Decodes; bad opens and chunks, and an idle session,
// end with statuses that name the problem while the server keeps serving.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/npy.h"
#include "rpc/session_client.h"
#include "rpc/session_stream.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

void ExpectReached(const absl::Status& s) { EXPECT_TRUE(s.ok()) << s; }

// The test's open: `whole`'s, in `mode`, named `id` ("": the server names it).
v1::SessionOpen OpenFor(const v1::DecodeRequest& whole, v1::Mode mode, const std::string& id = "") {
  absl::StatusOr<v1::SessionOpen> made = rpc::SessionOpenFor(whole);
  EXPECT_TRUE(made.ok()) << made.status();
  v1::SessionOpen open = made.value_or(v1::SessionOpen());
  open.set_mode(mode);
  open.set_session_id(id);
  return open;
}

// The whole clip's Decode in `mode`: what a session in that mode must equal.
DecodeOutcome WholeDecode(v1::VaeDecoder::Stub& stub, v1::DecodeRequest request, v1::Mode mode) {
  request.set_mode(mode);
  return Decode(stub, request);
}

using SessionOutcome = rpc::SessionCall;

// One session: `open`, then `latent` in chunks of `chunks` latent frames
// (each sent once the one before has its trailer; `after_chunk(i)` runs
// once chunk i has its trailer, `on_frames(chunk)` on every Chunk message),
// then a close.
SessionOutcome RunSession(v1::VaeDecoder::Stub& stub, const v1::SessionOpen& open, const v1::Tensor& latent,
                          const std::vector<int64_t>& chunks, const std::function<void(int64_t)>& after_chunk = nullptr,
                          const std::function<void(const v1::Chunk&)>& on_frames = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(240)));
  rpc::SessionCallbacks callbacks;
  callbacks.after_chunk = after_chunk;
  if (on_frames) {
    callbacks.on_message = [&on_frames](const v1::DecodeResponse& m) {
      if (m.has_chunk()) on_frames(m.chunk());
    };
  }
  return rpc::RunDecodeSession(stub, ctx, open, latent, chunks, callbacks);
}

std::vector<float> ClipFloats(SessionOutcome& out) {
  const std::string& bytes = out.stream.clip().tensor_bytes();
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::vector<float> NpyFloats(const formats::NpyArray& a) {
  std::vector<float> v(a.data.size() / 4);
  std::memcpy(v.data(), a.data.data(), v.size() * 4);
  return v;
}

// The session's clip equals the whole clip's Decode: bit for bit (dense) or
// within 3e-5 (exact).
void ExpectClipEquals(SessionOutcome& out, const DecodeOutcome& whole, double tolerance, const std::string& what) {
  ASSERT_TRUE(out.status.ok()) << what << ": " << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << what << ": " << out.stream_error;
  ASSERT_TRUE(whole.status.ok()) << what << ": " << whole.status.error_message();
  EXPECT_EQ(Shape(out.stream.clip().header()), Shape(whole.output.header())) << what;
  EXPECT_LE(MaxAbsDiff(ClipFloats(out), AsFloats(whole)), tolerance) << what;
}

class SessionServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = StartServing(RealWorkerFlags(FixtureRepository({"wan21", "hunyuanvideo15", "sd_kl", "minimax_h3"}),
                                           "cpu:2", 2, {"--session_idle_timeout_s=20", "--heartbeat_timeout_s=2"}),
                           {"wan21", "hunyuanvideo15", "sd_kl", "minimax_h3"})
                  .release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static ServerProcess* server_;
};
ServerProcess* SessionServiceTest::server_ = nullptr;

TEST_F(SessionServiceTest, ChunksEqualTheWholeClipDenseAndExactOverSeveralChunkings) {
  ASSERT_NE(server_, nullptr);
  const v1::DecodeRequest whole = FixtureRequest("wan21", FixturePath("wan21/latent.safetensors"));  // T = 4, H = 7
  for (v1::Mode mode : {v1::MODE_DENSE, v1::MODE_EXACT}) {
    const DecodeOutcome reference = WholeDecode(server_->stub(), whole, mode);
    for (const std::vector<int64_t>& chunks : std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {2, 2}, {1, 3}, {4}}) {
      const std::string what = absl::StrCat(v1::Mode_Name(mode), " chunks ", chunks.size(), " first ", chunks[0]);
      SessionOutcome out = RunSession(server_->stub(), OpenFor(whole, mode), whole.latent(), chunks);
      ExpectClipEquals(out, reference, mode == v1::MODE_DENSE ? 0.0 : 3e-5, what);
      EXPECT_EQ(out.stream.header().mode(), mode) << what;
      EXPECT_EQ(out.stream.header().degree(), mode == v1::MODE_EXACT ? 2 : 1) << what;
      ASSERT_EQ(out.stream.chunk_trailers().size(), chunks.size()) << what;
      // 1 + 4 (t - 1) frames for the first chunk, 4 t for the others.
      EXPECT_EQ(out.stream.chunk_trailers()[0].frames(), 1 + 4 * (chunks[0] - 1)) << what;
      EXPECT_EQ(out.stream.trailer().session_chunks(), static_cast<int64_t>(chunks.size())) << what;
      EXPECT_EQ(out.stream.trailer().session_frames(), 13) << what;
      for (const v1::ChunkTrailer& t : out.stream.chunk_trailers()) {
        EXPECT_EQ(t.replayed_latent_frames(), 0) << what;
        EXPECT_EQ(t.state_bytes_per_rank_size(), 2) << what;
        // A dense session's state is on the leader; an exact one's on both.
        EXPECT_GT(t.state_bytes_per_rank(0), 0) << what;
        EXPECT_EQ(t.state_bytes_per_rank(1) > 0, mode == v1::MODE_EXACT) << what;
      }
    }
  }
}

// HunyuanVideo 1.5 streams too (causal convs' kept frames, the mid block's
// keys and values of earlier chunks); dense sessions equal the whole decode
// bit for bit (both go a latent frame at a time). An image model and a video
// model that cannot stream say why.
TEST_F(SessionServiceTest, HunyuanVideo15StreamsAndModelsThatCannotSayWhy) {
  ASSERT_NE(server_, nullptr);
  const v1::DecodeRequest whole = FixtureRequest("hunyuanvideo15", FixturePath("hunyuanvideo15/latent.safetensors"));
  for (v1::Mode mode : {v1::MODE_DENSE, v1::MODE_EXACT}) {
    const DecodeOutcome reference = WholeDecode(server_->stub(), whole, mode);
    SessionOutcome out = RunSession(server_->stub(), OpenFor(whole, mode), whole.latent(), {1, 2, 2});
    // Dense: bit for bit (0); exact within rounding.
    ExpectClipEquals(out, reference, mode == v1::MODE_DENSE ? 0 : 3e-5,
                     absl::StrCat("hunyuanvideo15 ", v1::Mode_Name(mode)));
    EXPECT_EQ(out.stream.trailer().session_frames(), 17);
  }
  v1::ListModelsResponse models;
  grpc::ClientContext ctx;
  ASSERT_TRUE(server_->stub().ListModels(&ctx, v1::ListModelsRequest(), &models).ok());
  for (const v1::ModelInfo& m : models.models()) {
    EXPECT_EQ(m.streams(), m.name() != "sd_kl") << m.name();
    EXPECT_EQ(m.session_state_bytes_per_latent() > 0, m.streams()) << m.name();
  }
  v1::SessionOpen image = OpenFor(whole, v1::MODE_DENSE);
  image.set_model("sd_kl");
  SessionOutcome refused = RunSession(server_->stub(), image, whole.latent(), {1});
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.status.error_message();
  EXPECT_THAT(refused.status.error_message(), HasSubstr("is an image model"));
}

// MiniMax-H3's windows stream: a window's frames come once its 7 latent
// frames have, the last window's and the faded overlap with the last chunk
// (last_chunk), so chunks may return no frame; the clip equals the whole
// Decode (dense bit for bit, exact within 3e-5 over bands 2 and 1). A plain
// close after chunks would lose the held frames and is refused by name; a
// clip too short for a window is refused when it ends.
TEST_F(SessionServiceTest, MiniMaxH3WindowsStreamAndTheLastChunkReturnsTheHeldFrames) {
  ASSERT_NE(server_, nullptr);
  const v1::DecodeRequest whole = FixtureRequest("minimax_h3", FixturePath("minimax_h3/latent.safetensors"));
  ASSERT_EQ(whole.latent().shape(2), 9);
  for (v1::Mode mode : {v1::MODE_DENSE, v1::MODE_EXACT}) {
    const DecodeOutcome reference = WholeDecode(server_->stub(), whole, mode);
    for (const std::vector<int64_t>& chunks :
         std::vector<std::vector<int64_t>>{{1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 4, 2}, {9}}) {
      const std::string what = absl::StrCat("minimax_h3 ", v1::Mode_Name(mode), " chunks ", chunks.size());
      SessionOutcome out = RunSession(server_->stub(), OpenFor(whole, mode), whole.latent(), chunks);
      ExpectClipEquals(out, reference, mode == v1::MODE_DENSE ? 0.0 : 3e-5, what);
      ASSERT_EQ(out.stream.chunk_trailers().size(), chunks.size()) << what;
      std::vector<int64_t> frames;
      for (const v1::ChunkTrailer& t : out.stream.chunk_trailers()) frames.push_back(t.frames());
      // Window 0 (latent frames 0-6): 17 frames once frame 6 came; the rest
      // (window 1 from the clip padded by 3, the overlap, less the pad's) at the end.
      const std::vector<int64_t> want = chunks.size() == 9   ? std::vector<int64_t>{0, 0, 0, 0, 0, 0, 17, 0, 13}
                                        : chunks.size() == 3 ? std::vector<int64_t>{0, 17, 13}
                                                             : std::vector<int64_t>{30};
      EXPECT_EQ(frames, want) << what;
      EXPECT_EQ(out.stream.trailer().session_frames(), 30) << what;
    }
  }
  v1::ListModelsResponse models;
  grpc::ClientContext list;
  ASSERT_TRUE(server_->stub().ListModels(&list, v1::ListModelsRequest(), &models).ok());
  for (const v1::ModelInfo& m : models.models()) {
    EXPECT_EQ(m.session_holds_clip_end(), m.name() == "minimax_h3") << m.name();
    // A one-frame chunk's most frames: a window's with the overlap at the
    // clip's end (17 + 5: latent frame 7 ends a clip of one window), or the
    // temporal factor.
    const int64_t most = m.name() == "minimax_h3" ? 22 : m.name() == "sd_kl" ? 0 : 4;
    EXPECT_EQ(m.session_chunk_frames(), most) << m.name();
  }
  // A chunk and then a plain close: refused, naming last_chunk.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto call = server_->stub().DecodeSession(&ctx);
    v1::SessionRequest message;
    *message.mutable_open() = OpenFor(whole, v1::MODE_DENSE);
    ASSERT_TRUE(call->Write(message));
    v1::DecodeResponse m;
    ASSERT_TRUE(call->Read(&m));
    EXPECT_TRUE(m.has_session_header());
    *message.mutable_chunk() = rpc::LatentFrames(whole.latent(), 0, 8);
    ASSERT_TRUE(call->Write(message));
    do {
      ASSERT_TRUE(call->Read(&m));
    } while (!m.has_chunk_trailer());
    EXPECT_EQ(m.chunk_trailer().frames(), 17);
    message.mutable_close();
    ASSERT_TRUE(call->Write(message));
    call->WritesDone();
    while (call->Read(&m)) {
    }
    const grpc::Status status = call->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("last_chunk"));
  }
  // A clip of 2 latent frames makes no window.
  SessionOutcome short_clip =
      RunSession(server_->stub(), OpenFor(whole, v1::MODE_EXACT), rpc::LatentFrames(whole.latent(), 0, 2), {1, 1});
  EXPECT_EQ(short_clip.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << short_clip.status.error_message();
  EXPECT_THAT(short_clip.status.error_message(), HasSubstr("decodes at least 3"));
  ExpectOk(Decode(server_->stub(), whole));
}

TEST_F(SessionServiceTest, ABatchOfTwoWithUnevenBandsInterleavedWithOtherCalls) {
  ASSERT_NE(server_, nullptr);
  const v1::DecodeRequest whole = SyntheticRequest("wan21", {2, 16, 3, 5, 6});
  const DecodeOutcome reference = WholeDecode(server_->stub(), whole, v1::MODE_EXACT);
  const v1::DecodeRequest other = FixtureRequest("wan21", FixturePath("wan21/latent_t2.safetensors"));
  const DecodeOutcome other_reference = Decode(server_->stub(), other);
  // Two sessions and Decodes at once on the one group: every chunk is a job
  // like the Decodes, and each session keeps its own state.
  SessionOutcome a, b;
  std::thread ta([&] { a = RunSession(server_->stub(), OpenFor(whole, v1::MODE_EXACT, "a"), whole.latent(), {1, 2}); });
  std::thread tb([&] { b = RunSession(server_->stub(), OpenFor(whole, v1::MODE_AUTO, "b"), whole.latent(), {2, 1}); });
  for (int i = 0; i < 3; ++i) {
    const DecodeOutcome decoded = Decode(server_->stub(), other);
    ExpectOk(decoded);
    EXPECT_EQ(MaxAbsDiff(AsFloats(decoded), AsFloats(other_reference)), 0.0);
  }
  ta.join();
  tb.join();
  ExpectClipEquals(a, reference, 3e-5, "session a");
  ExpectClipEquals(b, reference, 3e-5, "session b (auto: exact)");
  EXPECT_EQ(b.stream.header().mode(), v1::MODE_EXACT);
  EXPECT_EQ(b.stream.header().session_id(), "b");
  ExpectReached(server_->WaitMetric("vaedecode_sessions_open", {}, 0));
}

// Wan 2.1's causal cache, and MiniMax-H3's window stream, whose first chunk
// returned no frame and whose replay rebuilds the latents a window waits for.
TEST_F(SessionServiceTest, ASessionSurvivesAWorkerKilledBetweenItsChunks) {
  ASSERT_NE(server_, nullptr);
  struct Case {
    std::string model;
    std::vector<int64_t> chunks;
  };
  for (const Case& c : {Case{"wan21", {1, 2, 1}}, Case{"minimax_h3", {3, 4, 2}}}) {
    const v1::DecodeRequest whole = FixtureRequest(c.model, FixturePath(c.model + "/latent.safetensors"));
    const DecodeOutcome reference = WholeDecode(server_->stub(), whole, v1::MODE_EXACT);
    std::string killed_group;
    SessionOutcome out =
        RunSession(server_->stub(), OpenFor(whole, v1::MODE_EXACT), whole.latent(), c.chunks, [&](int64_t chunk) {
          if (chunk != 0) return;
          const WorkerProcess peer = Rank(*server_, 1);
          ASSERT_GT(peer.pid, 0);
          killed_group = peer.group;
          ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
        });
    ExpectClipEquals(out, reference, 3e-5, c.model + " after the kill");
    ASSERT_EQ(out.stream.chunk_trailers().size(), 3u) << c.model;
    // The chunk after the kill rebuilt the state from the one before.
    EXPECT_EQ(out.stream.chunk_trailers()[1].replayed_latent_frames(), c.chunks[0]) << c.model;
    EXPECT_EQ(out.stream.chunk_trailers()[2].replayed_latent_frames(), 0) << c.model;
    EXPECT_FALSE(killed_group.empty()) << c.model;
    EXPECT_THAT(server_->Log(), HasSubstr(absl::StrCat("model=", c.model, " ")));
    EXPECT_THAT(server_->Log(), HasSubstr(absl::StrCat("replayed_latent_frames=", c.chunks[0])));
  }
}

// Killed while a chunk decodes, after some of its frames reached the client:
// the chunk goes back to the queue, runs on the rebuilt group after the
// session's history, and streams only the frames the client does not have
// yet (a frame twice would break the assembled clip).
TEST_F(SessionServiceTest, ASessionSurvivesAWorkerKilledDuringAChunk) {
  ASSERT_NE(server_, nullptr);
  // Large enough that a two-latent-frame chunk decodes for a while (its
  // first four frames stream before its last four).
  const v1::DecodeRequest whole = SyntheticRequest("wan21", {1, 16, 5, 24, 20});
  const DecodeOutcome reference = WholeDecode(server_->stub(), whole, v1::MODE_EXACT);
  bool killed = false;
  SessionOutcome out = RunSession(server_->stub(), OpenFor(whole, v1::MODE_EXACT, "killed-mid-chunk"), whole.latent(),
                                  {1, 2, 2}, nullptr, [&](const v1::Chunk& c) {
                                    // Chunk 1's first frames (1-4, from its first latent frame) are
                                    // here; its second latent frame is decoding.
                                    if (c.frame() != 1 || c.row_begin() != 0 || killed) return;
                                    killed = true;
                                    const WorkerProcess peer = Rank(*server_, 1);
                                    ASSERT_GT(peer.pid, 0);
                                    ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
                                  });
  EXPECT_TRUE(killed);
  ExpectClipEquals(out, reference, 3e-5, "killed during chunk 1");
  ASSERT_EQ(out.stream.chunk_trailers().size(), 3u);
  EXPECT_EQ(out.stream.chunk_trailers()[1].replayed_latent_frames(), 1);
  EXPECT_THAT(server_->Log(), HasSubstr("event=session_chunk_retry session=killed-mid-chunk"));
}

// The same with PNG frames: a file is forwarded once whole, so the retry
// neither repeats nor truncates one (dense: the files are the Decode's, byte
// for byte).
TEST_F(SessionServiceTest, PngFramesSurviveAWorkerKilledDuringAChunk) {
  ASSERT_NE(server_, nullptr);
  v1::DecodeRequest whole = SyntheticRequest("wan21", {1, 16, 5, 24, 20});
  whole.set_output_format(v1::OUTPUT_PNG);
  const DecodeOutcome reference = WholeDecode(server_->stub(), whole, v1::MODE_DENSE);
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  bool killed = false;
  SessionOutcome out = RunSession(server_->stub(), OpenFor(whole, v1::MODE_DENSE, "png-killed"), whole.latent(),
                                  {1, 2, 2}, nullptr, [&](const v1::Chunk& c) {
                                    if (c.frame() != 1 || killed) return;
                                    killed = true;
                                    const WorkerProcess peer = Rank(*server_, 1);
                                    ASSERT_GT(peer.pid, 0);
                                    ASSERT_EQ(kill(peer.pid, SIGKILL), 0);
                                  });
  EXPECT_TRUE(killed);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << out.stream_error;
  EXPECT_EQ(out.stream.clip().images(), reference.output.images());
  EXPECT_THAT(server_->Log(), HasSubstr("event=session_chunk_retry session=png-killed"));
}

// One fixture's latent through both clients' session modes, `cpp_chunks` and
// `py_chunks` at a time: each writes the clip the C++ client's whole Decode
// writes (byte for byte at `tolerance` 0) and prints the lines given.
void ExpectClientSessionsEqualTheWhole(const std::string& address, const std::string& dir, const std::string& name,
                                       const std::string& options, const std::string& cpp_chunks,
                                       const std::vector<std::string>& cpp_lines, const std::string& py_chunks,
                                       const std::string& py_line, double tolerance) {
  const std::string latent = FixturePath(name + "/latent.safetensors");
  const FloatTensor t = ReadFloat(latent);
  const std::string npy = absl::StrCat(dir, "/", name, "_latent.npy");
  ASSERT_TRUE(formats::WriteNpy(npy, formats::DType::kF32, t.shape, t.data.data(), t.data.size() * 4).ok());
  const std::string common = absl::StrCat(" --server=", address, " --model=", name, " ", options);
  const std::string cpp = Runfile("client/vaedecode_client");
  const std::string py = "/usr/bin/python3 " + Runfile("client/python/vaedecode_client.py");
  const std::string out = absl::StrCat(dir, "/", name);
  const CommandResult whole = RunCommand(absl::StrCat(cpp, common, " --latent=", latent, " --out=", out, "_whole.npy"));
  ASSERT_EQ(whole.status, 0) << whole.output;
  const CommandResult cpp_session = RunCommand(
      absl::StrCat(cpp, common, " --latent=", latent, " --stream_chunks=", cpp_chunks, " --out=", out, "_cpp.npy"));
  ASSERT_EQ(cpp_session.status, 0) << cpp_session.output;
  for (const std::string& line : cpp_lines) EXPECT_THAT(cpp_session.output, HasSubstr(line));
  const CommandResult py_session = RunCommand(
      absl::StrCat(py, common, " --latent=", npy, " --stream-chunks ", py_chunks, " --out=", out, "_py.npy"));
  ASSERT_EQ(py_session.status, 0) << py_session.output;
  EXPECT_THAT(py_session.output, HasSubstr(py_line));
  absl::StatusOr<formats::NpyArray> want = formats::ReadNpy(out + "_whole.npy");
  ASSERT_TRUE(want.ok()) << want.status();
  for (const char* client : {"_cpp.npy", "_py.npy"}) {
    absl::StatusOr<formats::NpyArray> got = formats::ReadNpy(out + client);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->shape, want->shape) << name << client;
    if (tolerance == 0) {
      EXPECT_TRUE(got->data == want->data) << name << client << ": the session's clip differs from the whole decode";
    } else {
      EXPECT_LE(MaxAbsDiff(NpyFloats(*got), NpyFloats(*want)), tolerance) << name << client;
    }
  }
}

// The C++ client's --stream_chunks and the Python client's --stream-chunks
// write the clip a Decode of the whole latent writes, byte for byte (dense).
TEST_F(SessionServiceTest, BothClientsDecodeAClipInChunksAsTheWholeDecode) {
  ASSERT_NE(server_, nullptr);
  const std::string dir = TempDir("clients");
  ExpectClientSessionsEqualTheWhole(server_->address(), dir, "wan21", "--mode=dense", "1,2,1",
                                    {"chunk=2 first_frame=9 frames=4", "chunks=3 frames=13"}, "2,2",
                                    "chunk=1 first_frame=5 frames=8", 0);
  // MiniMax-H3: chunks that return no frame, and the held frames with the
  // last chunk; exact over the group (a session's windows are the whole
  // decode's, on the same bands).
  ExpectClientSessionsEqualTheWhole(server_->address(), dir, "minimax_h3", "--mode=exact", "3,4,2",
                                    {"chunk=0 first_frame=0 frames=0", "chunk=2 first_frame=17 frames=13"}, "7,2",
                                    "chunk=1 first_frame=17 frames=13", 3e-5);
  const std::string latent = FixturePath("wan21/latent.safetensors");
  const std::string common = absl::StrCat(" --server=", server_->address(), " --model=wan21 --mode=dense");
  const std::string cpp = Runfile("client/vaedecode_client");
  // Chunks that do not add up to the latent are refused before any call.
  const CommandResult bad =
      RunCommand(absl::StrCat(cpp, common, " --latent=", latent, " --stream_chunks=1,2 --out=", dir, "/bad.npy"));
  EXPECT_EQ(WEXITSTATUS(bad.status), 2) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("--stream_chunks adds up to 3 latent frames; the latent has 4"));
  // So is a decode timestep or noise (a session mixes none).
  const CommandResult noisy = RunCommand(absl::StrCat(
      cpp, common, " --latent=", latent, " --stream_chunks=2,2 --decode_timestep=0.05 --out=", dir, "/n.npy"));
  EXPECT_EQ(WEXITSTATUS(noisy.status), 2) << noisy.output;
  EXPECT_THAT(noisy.output, HasSubstr("without noise"));
}

// Admission counts the memory each group reported: on ranks of a 16 MiB
// budget, a session whose measured state and one-frame chunk do not fit is
// refused at open, naming the numbers, while a small one streams.
TEST(SessionAdmission, ASessionThatWouldNotFitItsGroupsMemoryIsRefusedAtOpen) {
  auto server =
      StartServing(RealWorkerFlags(FixtureRepository({"wan21"}), "cpu:2", 2, {"--memory_budget_mib=16"}), {"wan21"});
  ASSERT_NE(server, nullptr);
  const v1::DecodeRequest large = SyntheticRequest("wan21", {1, 16, 2, 96, 96});
  SessionOutcome refused = RunSession(server->stub(), OpenFor(large, v1::MODE_DENSE), large.latent(), {1, 1});
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.status.error_message();
  EXPECT_THAT(refused.status.error_message(), HasSubstr("has the memory"));
  const v1::DecodeRequest small = FixtureRequest("wan21", FixturePath("wan21/latent.safetensors"));
  SessionOutcome fine = RunSession(server->stub(), OpenFor(small, v1::MODE_DENSE), small.latent(), {2, 2});
  EXPECT_TRUE(fine.status.ok()) << fine.status.error_message();
}

TEST_F(SessionServiceTest, BadSessionsAreRefusedByNameAndTheServerKeepsServing) {
  ASSERT_NE(server_, nullptr);
  const v1::DecodeRequest whole = FixtureRequest("wan21", FixturePath("wan21/latent.safetensors"));
  struct Case {
    std::string name;
    std::function<void(v1::SessionOpen&, v1::Tensor&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown model", [](v1::SessionOpen& o, v1::Tensor&) { o.set_model("nope"); }, grpc::StatusCode::NOT_FOUND,
       "nope"},
      {"shape with frames", [](v1::SessionOpen& o, v1::Tensor&) { o.add_shape(3); }, grpc::StatusCode::INVALID_ARGUMENT,
       "[B, C, H, W]"},
      {"mp4", [](v1::SessionOpen& o, v1::Tensor&) { o.set_output_format(v1::OUTPUT_MP4); },
       grpc::StatusCode::INVALID_ARGUMENT, "OUTPUT_MP4"},
      {"tiled", [](v1::SessionOpen& o, v1::Tensor&) { o.set_mode(v1::MODE_TILED); }, grpc::StatusCode::INVALID_ARGUMENT,
       "dense or exact"},
      {"a frame no message can carry",
       [](v1::SessionOpen& o, v1::Tensor&) {
         o.set_shape(2, 4096);
         o.set_shape(3, 4096);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "more than a chunk may carry"},
      {"channels", [](v1::SessionOpen& o, v1::Tensor&) { o.set_shape(1, 4); }, grpc::StatusCode::INVALID_ARGUMENT,
       "channel"},
      {"chunk of another size", [](v1::SessionOpen&, v1::Tensor& t) { t.set_shape(3, 6); },
       grpc::StatusCode::INVALID_ARGUMENT, "a session's chunks are [1, 16, t, 7, 5]"},
      {"chunk of another dtype", [](v1::SessionOpen&, v1::Tensor& t) { t.set_dtype(v1::FLOAT16); },
       grpc::StatusCode::INVALID_ARGUMENT, "FLOAT32 with t >= 1"},
  };
  for (const Case& c : cases) {
    v1::SessionOpen open = OpenFor(whole, v1::MODE_DENSE);
    v1::Tensor latent = whole.latent();
    c.mutate(open, latent);
    SessionOutcome out = RunSession(server_->stub(), open, latent, {latent.shape(2)});
    EXPECT_EQ(out.status.error_code(), c.code) << c.name << ": " << out.status.error_message();
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // An idle session is ended, naming the timeout, and its room is freed.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto call = server_->stub().DecodeSession(&ctx);
    v1::SessionRequest first;
    *first.mutable_open() = OpenFor(whole, v1::MODE_DENSE, "idle");
    first.mutable_open()->set_idle_timeout_ms(500);
    ASSERT_TRUE(call->Write(first));
    v1::DecodeResponse m;
    ASSERT_TRUE(call->Read(&m));
    EXPECT_TRUE(m.has_session_header());
    while (call->Read(&m)) {
    }
    const grpc::Status status = call->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("idle timeout"));
  }
  ExpectReached(server_->WaitMetric("vaedecode_sessions_open", {}, 0));
  ExpectReached(server_->WaitMetric("vaedecode_sessions_total", {"status=\"DEADLINE_EXCEEDED\""}, 1));
  SessionOutcome fine = RunSession(server_->stub(), OpenFor(whole, v1::MODE_DENSE), whole.latent(), {2, 2});
  EXPECT_TRUE(fine.status.ok()) << fine.status.error_message();
  ExpectOk(Decode(server_->stub(), whole));
}

}  // namespace
}  // namespace vaedecode::testing
