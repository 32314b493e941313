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
  absl::Status final;
  std::vector<int64_t> written;
};

v1::DecodeResponse Chunk(int64_t row) {
  v1::DecodeResponse m;
  m.mutable_chunk()->set_row_begin(row);
  return m;
}

std::shared_ptr<Job> MakeJob(FakeStream& stream, int* done_calls, absl::Status* done_status,
                             size_t buffer = 2) {
  auto job = std::make_shared<Job>(v1::DecodeRequest(), v1::ModelInfo(), absl::Now(),
                                   absl::InfiniteFuture(), buffer);
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
  EXPECT_EQ(stream.written, (std::vector<int64_t>{0, 1, 2}));
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
  EXPECT_EQ(stream.written, (std::vector<int64_t>{0, 1, 2}));
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
  EXPECT_EQ(stream.written, (std::vector<int64_t>{0}));
  EXPECT_EQ(stream.final.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace vaedecode::server
