#include "rpc/status_macros.h"

#include <gtest/gtest.h>

#include <memory>

namespace {

absl::Status Fails() { return absl::InvalidArgumentError("x: bad"); }
absl::StatusOr<std::unique_ptr<int>> Seven() { return std::make_unique<int>(7); }
absl::StatusOr<int> NotFound() { return absl::NotFoundError("y: missing"); }

int calls = 0;
absl::Status Counted() {
  ++calls;
  return absl::OkStatus();
}

absl::Status Steps(bool fail_first, int* reached) {
  RETURN_IF_ERROR(Counted());
  if (fail_first) RETURN_IF_ERROR(Fails());
  ASSIGN_OR_RETURN(std::unique_ptr<int> seven, Seven());  // move-only values move
  *reached = *seven;
  ASSIGN_OR_RETURN(const int n, NotFound());
  *reached = n;
  return absl::OkStatus();
}

absl::StatusOr<int> Converts() {
  RETURN_IF_ERROR(Fails());
  return 1;
}

TEST(StatusMacrosTest, ReturnTheFirstErrorUnchangedAndEvaluateOnce) {
  int reached = 0;
  calls = 0;
  const absl::Status first = Steps(true, &reached);
  EXPECT_EQ(first, absl::InvalidArgumentError("x: bad"));
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(calls, 1);
  const absl::Status later = Steps(false, &reached);
  EXPECT_EQ(later, absl::NotFoundError("y: missing"));
  EXPECT_EQ(reached, 7);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(Converts().status(), absl::InvalidArgumentError("x: bad"));
}

}  // namespace
