#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"

namespace vaedecode::server {
namespace {

class NullStream : public JobStream {
 public:
  void StartWrite(const v1::DecodeResponse*) override {}
  void Abort() override {}
  void Finish(const absl::Status& s) override {
    absl::MutexLock lock(&mu);
    finished = true;
    status = s;
  }
  absl::Mutex mu;
  bool finished = false;
  absl::Status status;
};

struct TestJob {
  NullStream stream;
  std::shared_ptr<Job> job;
};

std::unique_ptr<TestJob> Make(const std::string& model, absl::Time deadline = absl::InfiniteFuture()) {
  auto t = std::make_unique<TestJob>();
  v1::ModelInfo m;
  m.set_name(model);
  t->job = std::make_shared<Job>(v1::DecodeRequest(), m, absl::Now(), deadline, JobBuffering());
  t->job->Attach(&t->stream, nullptr);
  return t;
}

const auto kAny = [](const Job&) { return true; };

TEST(SchedulerTest, FifoAndBounded) {
  int64_t reported = -1;
  Scheduler s(2, [&](int64_t d) { reported = d; });
  auto a = Make("a"), b = Make("b"), c = Make("c");
  ASSERT_TRUE(s.Enqueue(a->job).ok());
  ASSERT_TRUE(s.Enqueue(b->job).ok());
  EXPECT_EQ(reported, 2);
  EXPECT_EQ(s.Enqueue(c->job).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Next(kAny, absl::ZeroDuration()), a->job);
  EXPECT_EQ(s.Next(kAny, absl::ZeroDuration()), b->job);
  EXPECT_EQ(reported, 0);
  EXPECT_EQ(s.Next(kAny, absl::Milliseconds(10)), nullptr);
}

TEST(SchedulerTest, PicksTheOldestJobTheGroupCanRun) {
  Scheduler s(8, nullptr);
  auto a = Make("a"), b = Make("b"), b2 = Make("b");
  ASSERT_TRUE(s.Enqueue(a->job).ok());
  ASSERT_TRUE(s.Enqueue(b->job).ok());
  ASSERT_TRUE(s.Enqueue(b2->job).ok());
  const auto only_b = [](const Job& j) { return j.model().name() == "b"; };
  EXPECT_EQ(s.Next(only_b, absl::ZeroDuration()), b->job);
  EXPECT_EQ(s.Next(only_b, absl::ZeroDuration()), b2->job);
  EXPECT_EQ(s.Next(only_b, absl::Milliseconds(10)), nullptr);
  EXPECT_EQ(s.depth(), 1);
}

TEST(SchedulerTest, CancellingAQueuedJobRemovesIt) {
  Scheduler s(1, nullptr);
  auto a = Make("a"), b = Make("b");
  ASSERT_TRUE(s.Enqueue(a->job).ok());
  a->job->Cancel(absl::CancelledError("gone"));
  EXPECT_EQ(s.depth(), 0);
  EXPECT_TRUE(a->stream.finished);
  ASSERT_TRUE(s.Enqueue(b->job).ok());  // the slot is free again
}

TEST(SchedulerTest, ExpiredJobsFinishWithDeadlineExceeded) {
  Scheduler s(4, nullptr);
  auto late = Make("a", absl::Now() + absl::Milliseconds(30));
  ASSERT_TRUE(s.Enqueue(late->job).ok());
  const auto never = [](const Job&) { return false; };
  absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (s.depth() > 0 && absl::Now() < give_up) s.Next(never, absl::Milliseconds(100));
  EXPECT_EQ(s.depth(), 0);
  EXPECT_TRUE(late->stream.finished);
  EXPECT_EQ(late->stream.status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(SchedulerTest, NextWakesOnEnqueueAndCloseRefusesNewJobs) {
  Scheduler s(4, nullptr);
  auto a = Make("a");
  std::shared_ptr<Job> got;
  std::thread waiter([&] { got = s.Next(kAny, absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(s.Enqueue(a->job).ok());
  waiter.join();
  EXPECT_EQ(got, a->job);
  s.Close();
  auto b = Make("b");
  EXPECT_EQ(s.Enqueue(b->job).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.Next(kAny, absl::Seconds(10)), nullptr);  // closed and empty: at once
  EXPECT_FALSE(s.Requeue(b->job));
}

// While another thread holds `job`'s lock (so no hook can be armed on it),
// runs `put` (Enqueue or Requeue) and reports whether a dispatcher's Next
// could take the job meanwhile.
bool VisibleBeforeItsHookIsArmed(Scheduler& s, const std::shared_ptr<Job>& job, const std::function<void()>& put) {
  absl::Notification held, release;
  std::thread holder([&] {
    job->UpdateReport([&](JobReport&) {  // runs under the job's lock
      held.Notify();
      release.WaitForNotification();
    });
  });
  held.WaitForNotification();
  std::thread putter(put);
  absl::SleepFor(absl::Milliseconds(50));  // put has run as far as it can
  bool seen = false;
  std::thread dispatcher(
      [&] { s.Next([&](const Job& j) { return seen = seen || &j == job.get(); }, absl::ZeroDuration()); });
  absl::SleepFor(absl::Milliseconds(50));  // Next has looked at the queue
  release.Notify();
  holder.join();
  putter.join();
  dispatcher.join();
  return seen;
}

TEST(SchedulerTest, AJobIsArmedBeforeADispatcherCanTakeIt) {
  // A dispatcher that takes a job arms its own hook (it cancels the call to
  // the group). Had the queue's hook been armed after the job became
  // visible, it could land after the dispatcher's and replace it: a client's
  // cancel would then no longer reach the group, which decoded on for
  // nothing while the next request waited.
  Scheduler s(4, nullptr);
  auto a = Make("a");
  EXPECT_FALSE(VisibleBeforeItsHookIsArmed(s, a->job, [&] { ASSERT_TRUE(s.Enqueue(a->job).ok()); }));
  std::shared_ptr<Job> taken = s.Next(kAny, absl::Seconds(1));
  ASSERT_EQ(taken, a->job);
  EXPECT_FALSE(VisibleBeforeItsHookIsArmed(s, a->job, [&] { ASSERT_TRUE(s.Requeue(a->job)); }));
  // Armed by the queue: a cancel takes the job out of it.
  taken = s.Next(kAny, absl::Seconds(1));
  ASSERT_EQ(taken, a->job);
  ASSERT_TRUE(s.Requeue(a->job));
  a->job->Cancel(absl::CancelledError("the client went away"));
  EXPECT_EQ(s.depth(), 0);
  EXPECT_TRUE(a->stream.finished);
}

}  // namespace
}  // namespace vaedecode::server
