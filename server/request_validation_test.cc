#include "server/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

v1::ModelInfo Model(bool video) {
  v1::ModelInfo m;
  m.set_name("m");
  m.set_latent_channels(16);
  m.set_out_channels(3);
  m.set_is_video(video);
  return m;
}

v1::DecodeRequest Request(std::vector<int64_t> shape, v1::DType dtype = v1::FLOAT32) {
  v1::DecodeRequest r;
  r.set_model("m");
  int64_t n = 1;
  for (int64_t d : shape) {
    r.mutable_latent()->add_shape(d);
    n *= d;
  }
  r.mutable_latent()->set_dtype(dtype);
  r.mutable_latent()->set_data(std::string(n * DTypeSize(dtype).value(), '\0'));
  return r;
}

TEST(RequestValidationTest, AcceptsWellFormedLatents) {
  EXPECT_TRUE(ValidateDecodeRequest(Request({2, 16, 5, 7}), Model(false)).ok());
  EXPECT_TRUE(ValidateDecodeRequest(Request({1, 16, 3, 5, 7}, v1::BFLOAT16), Model(true)).ok());
  v1::DecodeRequest png = Request({1, 16, 5, 7}, v1::FLOAT16);
  png.set_output_format(v1::OUTPUT_PNG);
  EXPECT_TRUE(ValidateDecodeRequest(png, Model(false)).ok());
}

TEST(RequestValidationTest, NamesTheProblem) {
  struct Case {
    std::function<void(v1::DecodeRequest&)> mutate;
    bool video;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.clear_latent(); }, false, "latent: missing"},
      {[](auto& r) { r.mutable_latent()->set_dtype(v1::UINT8); }, false, "UINT8 is not a floating"},
      {[](auto& r) { r.mutable_latent()->set_dtype(static_cast<v1::DType>(99)); }, false,
       "unknown value 99"},
      {[](auto& r) {}, true, "[B, C, T, H, W] latents (rank 5), got rank 4"},
      {[](auto& r) { r.mutable_latent()->set_shape(0, 0); }, false, "dimension 0 is 0"},
      {[](auto& r) { r.mutable_latent()->set_shape(1, 4); }, false,
       "takes 16 latent channels, got 4"},
      {[](auto& r) { r.mutable_latent()->mutable_data()->push_back('x'); }, false, "needs 2240"},
      {[](auto& r) { r.set_latent_space(static_cast<v1::LatentSpace>(3)); }, false, "latent_space"},
      {[](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(7)); }, false,
       "output_format"},
      {[](auto& r) { r.set_mode(static_cast<v1::Mode>(7)); }, false, "mode: unknown value 7"},
      {[](auto& r) { r.set_request_id(std::string(129, 'a')); }, false, "request_id"},
  };
  for (const Case& c : cases) {
    v1::DecodeRequest r = Request({1, 16, 5, 7});
    c.mutate(r);
    const absl::Status s = ValidateDecodeRequest(r, Model(c.video));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
  v1::ModelInfo two = Model(false);
  two.set_out_channels(2);
  v1::DecodeRequest u8 = Request({1, 16, 5, 7});
  u8.set_output_format(v1::OUTPUT_UINT8);
  EXPECT_THAT(std::string(ValidateDecodeRequest(u8, two).message()),
              HasSubstr("1, 3 or 4 output channels"));
}

}  // namespace
}  // namespace vaedecode::server
