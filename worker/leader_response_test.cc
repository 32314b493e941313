// LeaderResponse on its own, with a sink that records what a Run call would
// stream: the order of Header, Chunks and Trailer, the header's fields, the
// rows streamed during an exact decode and the rest after it, and a caller
// that goes away.

#include "worker/leader_response.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/output_assembler.h"

namespace vaedecode::worker {
namespace {

using ::testing::HasSubstr;

// Messages arrive on LeaderResponse's writer thread: `messages` is read
// after Finish (which drains the writer) or after WaitFor.
class RecordingSink final : public ResponseSink {
 public:
  // Accepts `accept` messages, then answers as a caller that went away.
  explicit RecordingSink(int accept = 1 << 30) : accept_(accept) {}
  bool Write(const v1::DecodeResponse& message) override {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(messages.size()) >= accept_) return false;
    messages.push_back(message);
    return true;
  }
  bool cancelled() const override {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(messages.size()) >= accept_;
  }
  // Waits (up to a minute) until `n` messages were written; false if not.
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    const auto written = [this, n] { return messages.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&written), absl::Minutes(1));
  }
  std::vector<v1::DecodeResponse> messages;

 private:
  mutable absl::Mutex mu_;
  const int accept_;
};

at::Tensor Sample() { return (at::arange(1 * 3 * 6 * 4, at::kFloat) / 72.0 - 0.5).reshape({1, 3, 6, 4}); }

v1::DecodeRequest Request(v1::OutputFormat format = v1::OUTPUT_FLOAT32) {
  v1::DecodeRequest r;
  r.set_request_id("r-1");
  r.set_output_format(format);
  return r;
}

DecodeOutcome Outcome(const at::Tensor& sample, DecodeMode mode) {
  DecodeOutcome o;
  o.result.sample = sample;
  o.result.mode = mode;
  o.result.reason = "as planned";
  o.result.decode_ms = 12.5;
  o.result.gather_ms = 1.5;
  o.ranks = {RankStats{12.5, 1000, 2.0}, RankStats{12.0, 900, 3.0}};
  return o;
}

rpc::OutputAssembler Assembled(const std::vector<v1::DecodeResponse>& messages) {
  rpc::OutputAssembler out;
  for (const v1::DecodeResponse& m : messages) EXPECT_TRUE(out.Add(m).ok());
  EXPECT_TRUE(out.Finish().ok()) << out.Finish();
  return out;
}

TEST(LeaderResponse, HeaderChunksTrailerAfterADenseDecode) {
  RecordingSink sink;
  const v1::DecodeRequest request = Request();
  LeaderResponse response(sink, request, 64, {1, 3, 6, 4}, "decodes in float32 (force_upcast)");
  DecodePlan plan;
  plan.mode = DecodeMode::kDense;
  EXPECT_FALSE(response.StreamsRows(plan));
  const at::Tensor sample = Sample();
  ASSERT_TRUE(response.Finish(plan, Outcome(sample, DecodeMode::kDense), 2).ok());

  ASSERT_GE(sink.messages.size(), 3u);
  EXPECT_TRUE(sink.messages.front().has_header());
  EXPECT_TRUE(sink.messages.back().has_trailer());
  const v1::Header& h = sink.messages.front().header();
  EXPECT_EQ(h.request_id(), "r-1");
  EXPECT_EQ(h.mode(), v1::MODE_DENSE);
  EXPECT_EQ(h.degree(), 1);  // dense: one rank decoded, whatever the group
  EXPECT_THAT(h.mode_reason(), HasSubstr("as planned; decodes in float32 (force_upcast)"));
  const v1::Trailer& t = sink.messages.back().trailer();
  EXPECT_DOUBLE_EQ(t.timings().decode_ms(), 12.5);
  EXPECT_EQ(std::vector<int64_t>(t.peak_bytes_per_rank().begin(), t.peak_bytes_per_rank().end()),
            (std::vector<int64_t>{1000, 900}));
  EXPECT_EQ(std::vector<double>(t.collective_wait_ms_per_rank().begin(), t.collective_wait_ms_per_rank().end()),
            (std::vector<double>{2.0, 3.0}));
  for (size_t i = 1; i + 1 < sink.messages.size(); ++i) {
    ASSERT_TRUE(sink.messages[i].has_chunk());
    EXPECT_LE(sink.messages[i].chunk().data().size(), 64u);  // 48-byte rows, one per chunk
  }
  const rpc::OutputAssembler out = Assembled(sink.messages);
  EXPECT_EQ(std::memcmp(out.tensor_bytes().data(), sample.data_ptr(), sample.nbytes()), 0);
}

TEST(LeaderResponse, ExactDecodesStreamFinalRowsFirstThenTheRest) {
  RecordingSink sink;
  const v1::DecodeRequest request = Request();
  LeaderResponse response(sink, request, 1 << 20, {1, 3, 6, 4}, "");
  DecodePlan plan;
  plan.mode = DecodeMode::kExact;
  plan.world_size = 2;
  ASSERT_TRUE(response.StreamsRows(plan));
  const at::Tensor sample = Sample();
  response.RowsDuringDecode(plan, sample, 3);  // the leader's own band is final
  ASSERT_TRUE(sink.WaitFor(2));                // streamed before the decode ends
  ASSERT_EQ(sink.messages.size(), 2u);
  EXPECT_EQ(sink.messages[0].header().degree(), 2);
  EXPECT_EQ(sink.messages[1].chunk().row_begin(), 0);
  EXPECT_EQ(sink.messages[1].chunk().row_end(), 3);
  ASSERT_TRUE(response.Finish(plan, Outcome(sample, DecodeMode::kExact), 2).ok());
  EXPECT_EQ(sink.messages[2].chunk().row_begin(), 3);  // no row twice
  EXPECT_EQ(sink.messages[2].chunk().row_end(), 6);
  const rpc::OutputAssembler out = Assembled(sink.messages);
  EXPECT_EQ(std::memcmp(out.tensor_bytes().data(), sample.data_ptr(), sample.nbytes()), 0);
  // Encoded outputs wait for whole images.
  const v1::DecodeRequest png = Request(v1::OUTPUT_PNG);
  EXPECT_FALSE(LeaderResponse(sink, png, 1 << 20, {1, 3, 6, 4}, "").StreamsRows(plan));
}

TEST(LeaderResponse, ACallerThatLeftEndsTheStreamCancelled) {
  RecordingSink sink(/*accept=*/2);
  const v1::DecodeRequest request = Request();
  LeaderResponse response(sink, request, 48, {1, 3, 6, 4}, "");
  DecodePlan plan;
  const absl::Status s = response.Finish(plan, Outcome(Sample(), DecodeMode::kDense), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink.messages.size(), 2u);  // the header and one chunk; no trailer
}

}  // namespace
}  // namespace vaedecode::worker
