#include "server/model_catalog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace vaedecode::server {
namespace {

using ::testing::ElementsAre;

v1::ModelInfo Info(const std::string& name) {
  v1::ModelInfo m;
  m.set_name(name);
  return m;
}

TEST(ModelCatalogTest, ListsRepositoryFolders) {
  EXPECT_THAT(ListRepositoryModels("").value(), ElementsAre("default"));
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/repo";
  std::filesystem::create_directories(dir + "/sdxl");
  std::filesystem::create_directories(dir + "/flux");
  std::filesystem::create_directories(dir + "/.cache");
  EXPECT_THAT(ListRepositoryModels(dir).value(), ElementsAre("flux", "sdxl"));
  EXPECT_EQ(ListRepositoryModels(dir + "/missing").status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::create_directories(dir + "/empty");
  EXPECT_EQ(ListRepositoryModels(dir + "/empty").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelCatalogTest, ReadinessFollowsGroups) {
  ModelCatalog c({"a", "b"});
  int changes = 0;
  c.SetListener([&] { ++changes; });
  EXPECT_EQ(c.Lookup("a").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.Lookup("z").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(c.Serving("a"));

  c.GroupReady("g0", {Info("a"), Info("b")});
  c.GroupReady("g1", {Info("a"), Info("b")});
  EXPECT_TRUE(c.Lookup("a").ok());
  EXPECT_TRUE(c.Serving("a"));
  EXPECT_TRUE(c.GroupServes("g1", "b"));
  c.GroupDown("g0");
  EXPECT_TRUE(c.Serving("a"));
  EXPECT_FALSE(c.GroupServes("g0", "a"));
  c.GroupDown("g1");
  EXPECT_FALSE(c.Serving("a"));
  EXPECT_TRUE(c.Lookup("a").ok());  // still described while the groups rebuild
  EXPECT_EQ(changes, 4);
  EXPECT_EQ(c.List().size(), 2u);
}

TEST(ModelCatalogTest, LeadersAreTheAuthorityOnNames) {
  ModelCatalog c({"a", "stray"});
  c.GroupReady("g0", {Info("a")});
  EXPECT_THAT(c.Names(), ElementsAre("a"));
  EXPECT_EQ(c.Lookup("stray").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vaedecode::server
