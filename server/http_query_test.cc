#include "server/http_query.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace vaedecode::server {
namespace {

TEST(HttpQueryTest, KeepsRepeatedPairsInOrder) {
  const QueryParams params = ParseQuery("/models/m?shape=1&shape=4&shape=4&dtype=float32&&flag");
  const std::vector<std::pair<std::string, std::string>> pairs(params.begin(), params.end());
  EXPECT_EQ(pairs, (std::vector<std::pair<std::string, std::string>>{
                       {"dtype", "float32"}, {"flag", ""}, {"shape", "1"}, {"shape", "4"}, {"shape", "4"}}));
  EXPECT_TRUE(ParseQuery("/models/m").empty());
}

TEST(HttpQueryTest, DecodesPercentAndPlus) {
  EXPECT_EQ(DecodeQueryComponent("a%20b+c%2Bd"), "a b c+d");
  EXPECT_EQ(DecodeQueryComponent("100%"), "100%");
  EXPECT_EQ(DecodeQueryComponent("%zz%4"), "%zz%4");
  EXPECT_EQ(DecodeQueryComponent("%00"), std::string(1, '\0'));
  const QueryParams params = ParseQuery("/?scaling%5Ffactor=0.5");
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params.begin()->first, "scaling_factor");
}

}  // namespace
}  // namespace vaedecode::server
