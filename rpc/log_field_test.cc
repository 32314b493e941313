#include "rpc/log_field.h"

#include <gtest/gtest.h>

namespace vaedecode::rpc {
namespace {

TEST(LogValueTest, PlainTokensStayAsTheyAre) {
  EXPECT_EQ(LogValue("sd-vae_ft.mse"), "sd-vae_ft.mse");
  EXPECT_EQ(LogValue("[1,4,64,64]"), "[1,4,64,64]");
}

TEST(LogValueTest, NewlinesSpacesAndQuotesCannotForgeLinesOrFields) {
  const std::string forged = LogValue("x\nrequest id=evil status=OK");
  EXPECT_EQ(forged, "\"x\\nrequest id=evil status=OK\"");
  EXPECT_EQ(forged.find('\n'), std::string::npos);
  EXPECT_EQ(LogValue("a\"b"), "\"a\\\"b\"");
  EXPECT_EQ(LogValue("a\\b"), "\"a\\\\b\"");
  EXPECT_EQ(LogValue(std::string("a\0b\r\x1b", 5)), "\"a\\000b\\r\\033\"");
}

TEST(LogValueTest, EmptyIsVisible) { EXPECT_EQ(LogValue(""), "\"\""); }

}  // namespace
}  // namespace vaedecode::rpc
