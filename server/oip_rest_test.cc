#include "server/oip_rest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(OipRestTest, BinaryTensorsFollowTheJsonHeader) {
  // What tritonclient.http sends: binary input, binary output.
  const std::string json =
      R"({"id":"r1","inputs":[{"name":"latent","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}],)"
      R"("outputs":[{"name":"sample","parameters":{"binary_data":true}}],"parameters":{"mode":"exact","fps":8}})";
  const std::string body = json + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  absl::StatusOr<RestInferRequest> r = ParseRestInferRequest(body, static_cast<int64_t>(json.size()), "m", "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->binary_output);
  EXPECT_EQ(r->request.id(), "r1");
  EXPECT_EQ(r->request.model_name(), "m");
  ASSERT_EQ(r->request.raw_input_contents_size(), 1);
  EXPECT_EQ(r->request.raw_input_contents(0).size(), 8u);
  EXPECT_EQ(r->request.inputs(0).shape_size(), 2);
  EXPECT_EQ(r->request.parameters().at("mode").string_param(), "exact");
  EXPECT_EQ(r->request.parameters().at("fps").int64_param(), 8);
}

TEST(OipRestTest, JsonDataIsFloat32Bytes) {
  absl::StatusOr<RestInferRequest> r = ParseRestInferRequest(
      R"({"inputs":[{"name":"latent","shape":[1,2,2],"datatype":"FP32","data":[[1.5,2],[3,-4]]}]})", -1, "m", "1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->binary_output);
  float v[4];
  ASSERT_EQ(r->request.raw_input_contents(0).size(), sizeof(v));
  std::memcpy(v, r->request.raw_input_contents(0).data(), sizeof(v));
  EXPECT_EQ(std::vector<float>(v, v + 4), (std::vector<float>{1.5f, 2, 3, -4}));
}

TEST(OipRestTest, NamesWhatIsWrong) {
  const std::vector<std::pair<std::pair<std::string, int64_t>, std::string>> cases = {
      {{"{not json", -1}, "not a JSON object"},
      {{R"({"inputs":[]})", -1}, "inputs: missing"},
      {{R"({"inputs":[{"name":"latent","shape":[1],"datatype":"FP16","data":[1]}]})", -1}, "send it as binary data"},
      {{R"({"inputs":[{"name":"latent","shape":[1.5],"datatype":"FP32","data":[1]}]})", -1},
       "shape must hold integers"},
      {{R"({"inputs":[{"name":"latent","shape":[1],"datatype":"FP32","data":[[[[[[[[[1]]]]]]]]]}]})", -1},
       "nested deeper than 8"},
      {{R"({"inputs":[{"name":"latent","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":9}}]})xxxx", 88},
       "within the 4 bytes left"},
      {{R"({"inputs":[{"name":"latent","shape":[1],"datatype":"FP32","data":[1]}]})",
        999},
       "Inference-Header-Content-Length"},
      {{R"({"parameters":{"x":[1]},"inputs":[{"name":"latent","shape":[1],"datatype":"FP32","data":[1]}]})", -1},
       "must be a bool, a number or a string"},
      {{R"({"parameters":{"output_format":"png"},"inputs":[{"name":"latent","shape":[1],"datatype":"FP32","data":[1]}]})",
        -1},
       "has no JSON form"},
  };
  for (const auto& [input, needle] : cases) {
    absl::StatusOr<RestInferRequest> r = ParseRestInferRequest(input.first, input.second, "m", "");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(r.status()), HasSubstr(needle));
  }
}

TEST(OipRestTest, RepliesInBinaryOrJson) {
  inference::ModelInferResponse response;
  response.set_model_name("m");
  response.set_model_version("1");
  auto* out = response.add_outputs();
  out->set_name("sample");
  out->set_datatype("FP32");
  out->add_shape(2);
  const float values[2] = {0.5f, -1};
  response.add_raw_output_contents(std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  (*response.mutable_parameters())["mode"].set_string_param("EXACT");

  absl::StatusOr<HttpReply> binary = BuildRestInferReply(response, true);
  ASSERT_TRUE(binary.ok());
  ASSERT_EQ(binary->headers.size(), 1u);
  EXPECT_EQ(binary->headers[0].first, "Inference-Header-Content-Length");
  const size_t json_length = std::stoul(binary->headers[0].second);
  EXPECT_THAT(binary->body.substr(0, json_length), HasSubstr(R"("binary_data_size":8)"));
  EXPECT_EQ(binary->body.size(), json_length + 8);

  absl::StatusOr<HttpReply> json = BuildRestInferReply(response, false);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(json->body, HasSubstr(R"("data":[0.5,-1.0])"));
  EXPECT_THAT(json->body, HasSubstr(R"("mode":"EXACT")"));

  out->set_datatype("BYTES");
  EXPECT_THAT(Message(BuildRestInferReply(response, false).status()), HasSubstr("no JSON form"));
}

TEST(OipRestTest, RepositoryIndexRequest) {
  EXPECT_EQ(ParseRepositoryIndexRequest("").value(), false);
  EXPECT_EQ(ParseRepositoryIndexRequest(R"({"ready":true})").value(), true);
  EXPECT_FALSE(ParseRepositoryIndexRequest(R"({"ready":"yes"})").ok());
}

}  // namespace
}  // namespace vaedecode::server
