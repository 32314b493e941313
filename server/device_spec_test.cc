#include "server/device_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vaedecode::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DeviceSpecTest, ParsesCpuAndCuda) {
  EXPECT_THAT(ParseDevices("cpu:3").value(), ElementsAre("cpu:0", "cpu:1", "cpu:2"));
  EXPECT_THAT(ParseDevices("cuda:0,1,3").value(), ElementsAre("cuda:0", "cuda:1", "cuda:3"));
}

TEST(DeviceSpecTest, RejectsNonsense) {
  for (const char* bad :
       {"", "cpu", "cpu:0", "cpu:x", "gpu:1", "cuda:", "cuda:0,0", "cuda:-1", "cuda:0,,1", "cpu:99999"}) {
    absl::StatusOr<std::vector<std::string>> d = ParseDevices(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr("--devices")) << bad;
  }
}

TEST(DeviceSpecTest, CarvesConsecutiveGroups) {
  std::vector<GroupSpec> g = CarveGroups({"cuda:0", "cuda:1", "cuda:2", "cuda:3"}, 2).value();
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "g0");
  EXPECT_THAT(g[0].devices, ElementsAre("cuda:0", "cuda:1"));
  EXPECT_EQ(g[1].name, "g1");
  EXPECT_THAT(g[1].devices, ElementsAre("cuda:2", "cuda:3"));
  EXPECT_EQ(CarveGroups({"cpu:0", "cpu:1", "cpu:2"}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CarveGroups({"cpu:0"}, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::server
