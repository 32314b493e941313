#include "server/job.h"

#include <gtest/gtest.h>

#include <thread>

namespace vaedecode::server {
namespace {

// Records what the Job does to the client stream; the test completes writes.
class FakeStream : public JobStream {
 public:
  void StartWrite(const v1::DecodeResponse* message) override {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(writing) << "two writes in flight";
    EXPECT_FALSE(finished) << "write after Finish";
    writing = true;
    written.push_back(message->chunk().row_begin());
  }
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(writing) << "Finish with a write in flight";
    EXPECT_FALSE(finished) << "Finish twice";
    finished = true;
    final = status;
  }
  void Abort() override {
    absl::MutexLock lock(&mu);
    ++aborts;
  }
  bool Writing() {
    absl::MutexLock lock(&mu);
    return writing;
  }
  void Complete(Job& job, bool ok = true) {
    {
      absl::MutexLock lock(&mu);
      writing = false;
    }
    job.OnWriteDone(ok);
  }

  absl::Mutex mu;
  bool writing = false;
  bool finished = false;
  int aborts = 0;
  absl::Status final;
  std::vector<int64_t> written;
};

// Chunks of one size (rows below 100 keep the varint at one byte).
v1::DecodeResponse Chunk(int64_t row) {
  v1::DecodeResponse m;
  m.mutable_chunk()->set_row_begin(row + 1);
  m.mutable_chunk()->set_data(std::string(100, 'x'));
  return m;
}
const int64_t kChunkBytes = static_cast<int64_t>(Chunk(0).ByteSizeLong());

// A job whose buffer holds `buffer` chunks behind the write in flight.
std::shared_ptr<Job> MakeJob(FakeStream& stream, int* done_calls, absl::Status* done_status, int64_t buffer = 2,
                             OutputBudget* budget = nullptr) {
  JobBuffering buffering;
  buffering.max_call_bytes = buffer * kChunkBytes;
  buffering.budget = budget;
  auto job =
      std::make_shared<Job>(v1::DecodeRequest(), v1::ModelInfo(), absl::Now(), absl::InfiniteFuture(), buffering);
  job->Attach(&stream, [done_calls, done_status](const Job&, const absl::Status& s) {
    ++*done_calls;
    *done_status = s;
  });
  return job;
}

TEST(JobTest, OneWriteInFlightThenFinishAfterTheBuffer) {
  FakeStream stream;
  int done = 0;
  absl::Status status;
  auto job = MakeJob(stream, &done, &status);
  ASSERT_TRUE(job->Push(Chunk(0)));
  ASSERT_TRUE(job->Push(Chunk(1)));
  ASSERT_TRUE(job->Push(Chunk(2)));  // buffer of 2 behind the write in flight
  job->Finish(absl::OkStatus());
  EXPECT_FALSE(stream.finished);
  stream.Complete(*job);
  stream.Complete(*job);
  EXPECT_FALSE(stream.finished);
  stream.Complete(*job);
  EXPECT_TRUE(stream.finished);
  EXPECT_TRUE(stream.final.ok());
  EXPECT_EQ(stream.written, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(done, 1);
  EXPECT_FALSE(job->Push(Chunk(3)));
}

TEST(JobTest, PushBlocksWhileTheBufferIsFull) {
  FakeStream stream;
  int done = 0;
  absl::Status status;
  auto job = MakeJob(stream, &done, &status, 1);
  ASSERT_TRUE(job->Push(Chunk(0)));  // in flight
  ASSERT_TRUE(job->Push(Chunk(1)));  // buffered
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    EXPECT_TRUE(job->Push(Chunk(2)));
    pushed = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(pushed.load());
  stream.Complete(*job);
  producer.join();
  EXPECT_TRUE(pushed.load());
  stream.Complete(*job);
  stream.Complete(*job);
  job->Finish(absl::OkStatus());
  EXPECT_EQ(stream.written, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(stream.finished);
}

TEST(JobTest, CancelUnblocksTheProducerRunsTheHookAndWinsTheStatus) {
  FakeStream stream;
  int done = 0;
  absl::Status status;
  auto job = MakeJob(stream, &done, &status, 1);
  int hooks = 0;
  ASSERT_TRUE(job->SetCancelHook([&] { ++hooks; }));
  ASSERT_TRUE(job->Push(Chunk(0)));
  ASSERT_TRUE(job->Push(Chunk(1)));
  std::thread producer([&] { EXPECT_FALSE(job->Push(Chunk(2))); });
  absl::SleepFor(absl::Milliseconds(20));
  job->Cancel(absl::CancelledError("client went away"));
  producer.join();
  EXPECT_EQ(hooks, 1);
  EXPECT_FALSE(stream.finished);  // the write in flight completes first
  stream.Complete(*job, false);
  EXPECT_TRUE(stream.finished);
  EXPECT_EQ(stream.final.code(), absl::StatusCode::kCancelled);
  job->Finish(absl::OkStatus());  // the dispatcher's late Finish changes nothing
  EXPECT_EQ(done, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(job->SetCancelHook([] {}));
}

TEST(JobTest, ErrorDropsBufferedMessages) {
  FakeStream stream;
  int done = 0;
  absl::Status status;
  auto job = MakeJob(stream, &done, &status);
  ASSERT_TRUE(job->Push(Chunk(0)));
  ASSERT_TRUE(job->Push(Chunk(1)));
  job->Finish(absl::UnavailableError("group broke"));
  stream.Complete(*job);
  EXPECT_TRUE(stream.finished);
  EXPECT_EQ(stream.written, (std::vector<int64_t>{1}));
  EXPECT_EQ(stream.final.code(), absl::StatusCode::kUnavailable);
}

TEST(JobTest, TheSharedBudgetBoundsEveryJobsBufferAndIsReturned) {
  OutputBudget budget(3 * kChunkBytes);
  FakeStream a_stream, b_stream;
  int done = 0;
  absl::Status status;
  auto a = MakeJob(a_stream, &done, &status, 100, &budget);
  auto b = MakeJob(b_stream, &done, &status, 100, &budget);
  ASSERT_TRUE(a->Push(Chunk(0)));  // in flight
  ASSERT_TRUE(a->Push(Chunk(1)));
  ASSERT_TRUE(b->Push(Chunk(0)));  // in flight
  EXPECT_EQ(budget.used(), 3 * kChunkBytes);
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    EXPECT_TRUE(b->Push(Chunk(1)));  // waits for room in the budget
    pushed = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(pushed.load());
  a_stream.Complete(*a);  // a's first write done: its bytes go back
  producer.join();
  EXPECT_TRUE(pushed.load());
  // An error drops a's buffer; its bytes go back too.
  a->Finish(absl::UnavailableError("group broke"));
  a_stream.Complete(*a);
  EXPECT_TRUE(a_stream.finished);
  EXPECT_EQ(budget.used(), 2 * kChunkBytes);  // b's two
  b_stream.Complete(*b);
  b_stream.Complete(*b);
  b->Finish(absl::OkStatus());
  EXPECT_EQ(budget.used(), 0);
}

TEST(JobTest, AStalledWriteIsSeenAndAbortingItEndsTheCall) {
  FakeStream stream;
  int done = 0;
  absl::Status status;
  auto job = MakeJob(stream, &done, &status);
  EXPECT_EQ(job->WriteStalledFor(absl::Now()), absl::ZeroDuration());
  ASSERT_TRUE(job->Push(Chunk(0)));
  ASSERT_TRUE(job->Push(Chunk(1)));
  job->Finish(absl::OkStatus());  // the group is done; the client is not reading
  EXPECT_GE(job->WriteStalledFor(absl::Now() + absl::Seconds(5)), absl::Seconds(5));
  job->AbortStalled(absl::CancelledError("the client read nothing"));
  EXPECT_EQ(stream.aborts, 1);
  EXPECT_FALSE(stream.finished);  // the stuck write fails first
  stream.Complete(*job, false);
  EXPECT_TRUE(stream.finished);
  EXPECT_EQ(stream.final.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(stream.written, (std::vector<int64_t>{1}));
  EXPECT_EQ(job->WriteStalledFor(absl::Now()), absl::ZeroDuration());
  job->AbortStalled(absl::CancelledError("again"));  // after the end: nothing happens
  EXPECT_EQ(stream.aborts, 1);
  EXPECT_EQ(done, 1);
}

}  // namespace
}  // namespace vaedecode::server
