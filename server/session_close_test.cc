// An ended session's room in the registry is given back when the job that
// frees its state on the workers is done, whatever its status, not before.

#include "server/session_close.h"

#include <gtest/gtest.h>

#include "server/session_registry.h"

namespace vaedecode::server {
namespace {

TEST(SessionClose, TheRoomIsGivenBackWhenTheCloseJobIsDone) {
  ModelCatalog catalog({"m"});
  v1::ModelInfo model;
  model.set_name("m");
  catalog.GroupReady("g0", {model});
  SessionLimits limits;
  limits.max_sessions_per_group = 1;
  auto registry = std::make_shared<SessionRegistry>(limits, catalog);
  for (const absl::Status& outcome : {absl::OkStatus(), absl::UnavailableError("the server is stopping")}) {
    absl::StatusOr<std::shared_ptr<SessionRecord>> a = registry->Open("a", "m", v1::MODE_DENSE, 100);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::shared_ptr<Job> close = MakeSessionCloseJob(*a, model, registry);
    EXPECT_TRUE(close->session_close());
    EXPECT_EQ(close->session(), *a);
    // The session's call is over, its state not yet freed: the group is still full.
    EXPECT_EQ(registry->open(), 1);
    EXPECT_EQ(registry->Open("b", "m", v1::MODE_DENSE, 100).status().code(), absl::StatusCode::kResourceExhausted);
    close->Finish(outcome);
    EXPECT_EQ(registry->open(), 0);
  }
  EXPECT_TRUE(registry->Open("c", "m", v1::MODE_DENSE, 100).ok());
}

}  // namespace
}  // namespace vaedecode::server
