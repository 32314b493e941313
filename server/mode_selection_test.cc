#include "server/mode_selection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

v1::ModelInfo Model(bool exact) {
  v1::ModelInfo m;
  m.set_name("m");
  m.set_family("autoencoder_kl");
  m.add_supported_modes(v1::MODE_DENSE);
  if (exact) m.add_supported_modes(v1::MODE_EXACT);
  return m;
}

v1::DecodeRequest Request(v1::Mode mode) {
  v1::DecodeRequest r;
  r.set_mode(mode);
  return r;
}

GroupResources Group(int degree) {
  GroupResources g;
  g.degree = degree;
  return g;
}

TEST(ModeSelectionTest, AutoIsExactOnlyWithRanksAndSupport) {
  EXPECT_EQ(SelectMode(Request(v1::MODE_AUTO), Model(true), Group(2))->mode, v1::MODE_EXACT);
  EXPECT_EQ(SelectMode(Request(v1::MODE_AUTO), Model(true), Group(1))->mode, v1::MODE_DENSE);
  absl::StatusOr<ModeChoice> no_support =
      SelectMode(Request(v1::MODE_AUTO), Model(false), Group(4));
  EXPECT_EQ(no_support->mode, v1::MODE_DENSE);
  EXPECT_THAT(no_support->reason, HasSubstr("autoencoder_kl"));
}

TEST(ModeSelectionTest, ForcedModesAreHonouredOrRefused) {
  EXPECT_EQ(SelectMode(Request(v1::MODE_DENSE), Model(true), Group(4))->mode, v1::MODE_DENSE);
  EXPECT_EQ(SelectMode(Request(v1::MODE_EXACT), Model(true), Group(2))->mode, v1::MODE_EXACT);
  EXPECT_EQ(SelectMode(Request(v1::MODE_EXACT), Model(true), Group(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = SelectMode(Request(v1::MODE_EXACT), Model(false), Group(2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("supports DENSE"));
  EXPECT_EQ(SelectMode(Request(v1::MODE_TILED), Model(true), Group(2)).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(SelectMode(Request(static_cast<v1::Mode>(17)), Model(true), Group(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::server
