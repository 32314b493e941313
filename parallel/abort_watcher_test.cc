// The abort protocol Gloo and NCCL share (ExplainGroupFailure), on an
// in-memory store standing in for the group's TCPStore.

#include "parallel/abort_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <memory>

namespace vaedecode::parallel {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<GroupStore> Rank(const c10::intrusive_ptr<c10d::Store>& store, int rank) {
  absl::StatusOr<std::unique_ptr<GroupStore>> group = GroupStore::Create(store, "g", rank, 2);
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *std::move(group) : nullptr;
}

TEST(ExplainGroupFailure, AFirstFailureIsPublishedAsItIs) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<GroupStore> rank0 = Rank(store, 0);
  const GroupFailure f = ExplainGroupFailure(rank0.get(), "g", absl::DeadlineExceededError("allreduce timed out"));
  EXPECT_EQ(f.status, absl::DeadlineExceededError("allreduce timed out"));
  EXPECT_TRUE(f.publish);
  EXPECT_THAT(f.abort_reason, HasSubstr("allreduce timed out"));
}

TEST(ExplainGroupFailure, AnEchoOfAPeersFailureReportsThePeersReason) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<GroupStore> rank0 = Rank(store, 0);
  std::unique_ptr<GroupStore> rank1 = Rank(store, 1);
  rank1->PublishAbort("out of memory in conv_in");
  const GroupFailure f = ExplainGroupFailure(rank0.get(), "g", absl::InternalError("Connection closed by peer"));
  EXPECT_EQ(f.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(f.status.message(), HasSubstr("group 'g' aborted: "));
  EXPECT_THAT(f.status.message(), HasSubstr("out of memory in conv_in"));
  EXPECT_THAT(f.status.message(), HasSubstr("(here: Connection closed by peer)"));
  EXPECT_FALSE(f.publish);  // the peer already did
  EXPECT_THAT(f.abort_reason, HasSubstr("out of memory in conv_in"));
}

TEST(ExplainGroupFailure, ABadCallIsNotTheGroupsFailure) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<GroupStore> rank0 = Rank(store, 0);
  std::unique_ptr<GroupStore> rank1 = Rank(store, 1);
  rank1->PublishAbort("peer went away");
  const GroupFailure f = ExplainGroupFailure(rank0.get(), "g", absl::InvalidArgumentError("shape mismatch"));
  EXPECT_EQ(f.status, absl::InvalidArgumentError("shape mismatch"));
  EXPECT_TRUE(f.publish);
}

TEST(ExplainGroupFailure, WithoutAStoreTheErrorStands) {
  const GroupFailure f = ExplainGroupFailure(nullptr, "g", absl::UnavailableError("gone"));
  EXPECT_EQ(f.status, absl::UnavailableError("gone"));
  EXPECT_TRUE(f.publish);
}

}  // namespace
}  // namespace vaedecode::parallel
