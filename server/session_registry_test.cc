// The session registry's room (sessions per group, the state budget, the
// capacity a group reported, states that grow) and a session record's
// history (the replay a rebuilt group gets, its bound).

#include "server/session_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/session_record.h"

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

ModelCatalog& CatalogWithTwoGroups() {
  static ModelCatalog* catalog = [] {
    auto* c = new ModelCatalog({"m"});
    v1::ModelInfo m;
    m.set_name("m");
    c->GroupReady("g0", {m});
    c->GroupReady("g1", {m});
    return c;
  }();
  return *catalog;
}

TEST(SessionRegistry, SpreadsSessionsAndRefusesPastEachLimitByName) {
  SessionLimits limits;
  limits.max_sessions_per_group = 1;
  limits.state_budget_bytes_per_rank = 1000;
  SessionRegistry registry(limits, CatalogWithTwoGroups());
  absl::StatusOr<std::shared_ptr<SessionRecord>> a = registry.Open("a", "m", v1::MODE_DENSE, 600);
  absl::StatusOr<std::shared_ptr<SessionRecord>> b = registry.Open("b", "m", v1::MODE_DENSE, 600);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->group(), (*b)->group());  // the emptier group
  absl::StatusOr<std::shared_ptr<SessionRecord>> c = registry.Open("c", "m", v1::MODE_DENSE, 10);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max_sessions_per_group"));
  EXPECT_THAT(registry.Open("d", "m", v1::MODE_DENSE, 2000).status().message(),
              HasSubstr("--session_state_budget_mib"));
  EXPECT_EQ(registry.Open("e", "nope", v1::MODE_DENSE, 1).status().code(), absl::StatusCode::kUnavailable);
  registry.Close(**a);
  EXPECT_TRUE(registry.Open("f", "m", v1::MODE_DENSE, 10).ok());
  EXPECT_EQ(registry.open(), 2);
}

TEST(SessionRegistry, CountsTheCapacityAGroupReportedAndStatesThatGrow) {
  SessionLimits limits;
  limits.state_budget_bytes_per_rank = 10000;
  SessionRegistry registry(limits, CatalogWithTwoGroups());
  registry.SetGroupCapacity([](const std::string& group) -> int64_t { return group == "g0" ? 1000 : -1; });
  // g1 reports no bound: a session too large for g0 goes there.
  absl::StatusOr<std::shared_ptr<SessionRecord>> big = registry.Open("big", "m", v1::MODE_DENSE, 700, 500);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*big)->group(), "g1");
  registry.SetGroupCapacity([](const std::string&) -> int64_t { return 1000; });
  absl::StatusOr<std::shared_ptr<SessionRecord>> small = registry.Open("small", "m", v1::MODE_DENSE, 300, 500);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->group(), "g0");
  absl::StatusOr<std::shared_ptr<SessionRecord>> more = registry.Open("more", "m", v1::MODE_DENSE, 400, 500);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(), HasSubstr("has the memory"));
  // A state that grows is counted as it grows, and refused past the capacity.
  EXPECT_TRUE(registry.Grow(**small, 900).ok());
  EXPECT_EQ((*small)->state_bytes_per_rank(), 900);
  absl::Status grown = registry.Grow(**small, 1100);
  EXPECT_EQ(grown.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(grown.message(), HasSubstr("grew to 1100"));
  registry.Close(**small);
  EXPECT_TRUE(registry.Open("again", "m", v1::MODE_DENSE, 400, 500).ok());
}

v1::Tensor Latent(int64_t frames, char fill) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  for (int64_t d : {int64_t{2}, int64_t{3}, frames, int64_t{1}, int64_t{1}}) t.add_shape(d);
  t.set_data(std::string(static_cast<size_t>(2 * 3 * frames * 4), fill));
  return t;
}

TEST(SessionRecord, ReplaysItsHistoryOnANewIncarnationWithinItsBound) {
  SessionRecord record(7, "s", "g0", v1::MODE_EXACT, 0, /*max_history_bytes=*/2 * 3 * 3 * 4);
  absl::StatusOr<internal::SessionStep> first = record.StepOn("inc1");
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->start());
  EXPECT_FALSE(first->has_replay());
  record.ChunkDone("inc1", Latent(1, 'a'));
  absl::StatusOr<internal::SessionStep> next = record.StepOn("inc1");
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->start());
  EXPECT_EQ(next->latent_frames_done(), 1);
  record.ChunkDone("inc1", Latent(2, 'b'));
  // A rebuilt group: the history, frames joined per (batch, channel).
  absl::StatusOr<internal::SessionStep> replay = record.StepOn("inc2");
  ASSERT_TRUE(replay.ok());
  EXPECT_TRUE(replay->start());
  EXPECT_EQ(replay->replay().shape(2), 3);
  EXPECT_EQ(replay->replay().data().substr(0, 12), std::string(4, 'a') + std::string(8, 'b'));
  EXPECT_EQ(record.last_replayed(), 3);
  // Past the bound the history is dropped: the session goes on where its
  // state is, and a lost state cannot be rebuilt.
  record.ChunkDone("inc2", Latent(1, 'c'));
  EXPECT_EQ(record.history_bytes(), 0);
  EXPECT_TRUE(record.StepOn("inc2").ok());
  record.StateLost();
  absl::StatusOr<internal::SessionStep> lost = record.StepOn("inc2");
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lost.status().message(), HasSubstr("--session_history_mib"));
}

}  // namespace
}  // namespace vaedecode::server
