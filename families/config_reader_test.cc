#include "families/config_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace vaedecode::families {
namespace {

using ::testing::HasSubstr;

TEST(ConfigReader, MissingAndNullGiveDefaults) {
  nlohmann::json j = {{"shift_factor", nullptr}};
  ConfigReader r(j, "config.json");
  EXPECT_EQ(r.Int("layers_per_block", 2), 2);
  EXPECT_FALSE(r.OptionalDouble("shift_factor").has_value());
  EXPECT_EQ(r.IntList("block_out_channels", {64}), std::vector<int64_t>{64});
  EXPECT_TRUE(r.status().ok());
}

TEST(ConfigReader, ReadsValuesAndIntegralFloats) {
  nlohmann::json j = {{"a", 3}, {"b", 4.0}, {"c", 0.5}, {"d", true}, {"e", {1, 2}}, {"f", "silu"}};
  ConfigReader r(j, "config.json");
  EXPECT_EQ(r.Int("a", 0), 3);
  EXPECT_EQ(r.Int("b", 0), 4);
  EXPECT_DOUBLE_EQ(r.Double("c", 0), 0.5);
  EXPECT_TRUE(r.Bool("d", false));
  EXPECT_EQ(r.IntList("e", {}), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.String("f", ""), "silu");
  EXPECT_TRUE(r.status().ok());
}

TEST(ConfigReader, CollectsEveryTypeError) {
  nlohmann::json j = {{"a", "x"}, {"b", 1.5}, {"e", {1, "two"}}};
  ConfigReader r(j, "vae/config.json");
  r.Int("a", 0);
  r.Int("b", 0);
  r.IntList("e", {});
  absl::Status s = r.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("vae/config.json"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"a\" must be an integer"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"b\" must be an integer"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"e\" must be a list of integers"));
}

TEST(ConfigReader, NonObjectConfigIsAnError) {
  nlohmann::json j = nlohmann::json::array();
  ConfigReader r(j, "config.json");
  EXPECT_FALSE(r.status().ok());
}

TEST(ConfigReader, ListsTheKeysNoGetterReadAndNobodyKnows) {
  const nlohmann::json j = {{"a", 1},   {"b", nullptr}, {"c", "x"}, {"encoder_only", 2}, {"_class_name", "X"},
                            {"typo", 3}};
  ConfigReader r(j, "c.json");
  r.Int("a", 0);
  r.Int("b", 0);  // null: read all the same
  r.String("c", "");
  r.Int("absent", 0);
  r.Known({"encoder_only"});
  EXPECT_EQ(r.UnreadKeys(), std::vector<std::string>{"typo"});
}

}  // namespace
}  // namespace vaedecode::families
