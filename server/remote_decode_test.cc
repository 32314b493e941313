#include "server/remote_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

v1::ModelInfo Flux() {
  v1::ModelInfo m;
  m.set_name("flux");
  m.set_latent_channels(16);
  m.set_out_channels(3);
  m.set_spatial_factor(8);
  m.set_scaling_factor(0.3611);
  return m;
}

QueryParams Params(std::vector<std::pair<std::string, std::string>> pairs) {
  return QueryParams(pairs.begin(), pairs.end());
}

std::string Floats(int64_t n) {
  std::string s(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(s.data() + i * 4, &v, 4);
  }
  return s;
}

TEST(RemoteDecodeTest, UnpacksLikeDiffusers) {
  // [1, 2 patches, 8] = 2 channels of 2x2 patches of a 16x32 image (h=2, w=4).
  std::vector<int64_t> shape;
  absl::StatusOr<std::string> z =
      UnpackPackedLatent(Floats(16), 4, {1, 2, 8}, 16, 32, 16, Packing::kPatches2x2, &shape);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(shape, (std::vector<int64_t>{1, 2, 2, 4}));
  float out[16];
  std::memcpy(out, z->data(), 64);
  // out[c, 2i+di, 2j+dj] = in[i*(w/2)+j, 4c + 2di + dj]: channel 0 row 0 is
  // patch 0's (0, 1) then patch 1's (8, 9); row 1 is (2, 3), (10, 11).
  EXPECT_EQ(std::vector<float>(out, out + 8), (std::vector<float>{0, 1, 8, 9, 2, 3, 10, 11}));
  EXPECT_EQ(std::vector<float>(out + 8, out + 16), (std::vector<float>{4, 5, 12, 13, 6, 7, 14, 15}));
  EXPECT_THAT(
      std::string(
          UnpackPackedLatent(Floats(24), 4, {1, 3, 8}, 16, 32, 16, Packing::kPatches2x2, &shape).status().message()),
      HasSubstr("packs into 2 tokens (16x16 pixels each); the latent [1, 3, 8] has 3"));
  EXPECT_THAT(
      std::string(
          UnpackPackedLatent(Floats(12), 4, {1, 2, 6}, 16, 32, 16, Packing::kPatches2x2, &shape).status().message()),
      HasSubstr("4 x channels"));
}

TEST(RemoteDecodeTest, UnpacksFlux2ByTransposing) {
  // Flux2Pipeline._pack_latents: [1, C=3, h=2, w=2] -> [1, 4 tokens, 3].
  std::vector<int64_t> shape;
  absl::StatusOr<std::string> z = UnpackPackedLatent(Floats(12), 4, {1, 4, 3}, 32, 32, 16, Packing::kFlatten, &shape);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(shape, (std::vector<int64_t>{1, 3, 2, 2}));
  float out[12];
  std::memcpy(out, z->data(), 48);
  // out[k, t] = in[t, k]
  EXPECT_EQ(std::vector<float>(out, out + 12), (std::vector<float>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
}

TEST(RemoteDecodeTest, PackedSizesThatOverflowAreRefusedBeforeAnyRead) {
  // 2^62 x 1 x 4 float32 elements is 2^66 bytes: 0 once wrapped in int64.
  std::vector<int64_t> shape;
  const absl::Status huge =
      UnpackPackedLatent("", 4, {int64_t{1} << 62, 1, 4}, 16, 16, 16, Packing::kPatches2x2, &shape).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.message()), HasSubstr("more than 2^40 elements"));
  // Tokens that no height and width can give, with a product that would wrap.
  const absl::Status wide =
      UnpackPackedLatent("", 4, {1, 4, 4}, int64_t{1} << 62, int64_t{1} << 62, 1, Packing::kPatches2x2, &shape)
          .status();
  EXPECT_THAT(std::string(wide.message()), HasSubstr("packs into more tokens"));
  // Through the query as curl sends it, with an empty body.
  const absl::Status query = TranslateRemoteDecode(Params({{"shape", "4611686018427387904"},
                                                           {"shape", "1"},
                                                           {"shape", "4"},
                                                           {"dtype", "float32"},
                                                           {"height", "16"},
                                                           {"width", "16"}}),
                                                   "", Flux())
                                 .status();
  EXPECT_EQ(query.code(), absl::StatusCode::kInvalidArgument);
}

TEST(RemoteDecodeTest, TranslatesWhatRemoteDecodeSends) {
  // remote_decode(..., scaling_factor=0.3611, shift_factor=0.1159, output_type="pt")
  absl::StatusOr<RemoteDecodeCall> call = TranslateRemoteDecode(Params({{"shape", "1"},
                                                                        {"shape", "16"},
                                                                        {"shape", "2"},
                                                                        {"shape", "2"},
                                                                        {"dtype", "float32"},
                                                                        {"output_type", "pt"},
                                                                        {"partial_postprocess", "False"},
                                                                        {"image_format", "jpg"},
                                                                        {"scaling_factor", "0.3611"},
                                                                        {"shift_factor", "0.1159"}}),
                                                                Floats(64), Flux());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->reply, RemoteReply::kTensor);
  EXPECT_EQ(call->request.output_format(), v1::OUTPUT_FLOAT32);
  EXPECT_EQ(call->request.latent_space(), v1::LATENT_SPACE_RAW);
  EXPECT_DOUBLE_EQ(call->request.scaling_factor(), 0.3611);
  EXPECT_DOUBLE_EQ(call->request.shift_factor(), 0.1159);
  EXPECT_EQ(call->request.latent().data().size(), 256u);

  // The default call: do_scaling=True, pil, jpg.
  call = TranslateRemoteDecode(Params({{"shape", "1"},
                                       {"shape", "16"},
                                       {"shape", "2"},
                                       {"shape", "2"},
                                       {"dtype", "float16"},
                                       {"do_scaling", "True"}}),
                               std::string(128, '\0'), Flux());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->reply, RemoteReply::kImageFile);
  EXPECT_EQ(call->request.output_format(), v1::OUTPUT_JPEG);
  EXPECT_EQ(call->request.latent_space(), v1::LATENT_SPACE_RAW);
  EXPECT_FALSE(call->request.has_scaling_factor());

  // A shift alone takes the model's scale.
  call = TranslateRemoteDecode(Params({{"shape", "1"},
                                       {"shape", "16"},
                                       {"shape", "2"},
                                       {"shape", "2"},
                                       {"dtype", "float32"},
                                       {"shift_factor", "0.5"},
                                       {"output_type", "pt"},
                                       {"partial_postprocess", "true"}}),
                               Floats(64), Flux());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->reply, RemoteReply::kPixels);
  EXPECT_DOUBLE_EQ(call->request.scaling_factor(), 0.3611);

  // A table option reaches the request by its name as a query parameter.
  call = TranslateRemoteDecode(Params({{"shape", "1"},
                                       {"shape", "16"},
                                       {"shape", "2"},
                                       {"shape", "2"},
                                       {"dtype", "float32"},
                                       {"image_format", "png"},
                                       {"png_compression", "0"}}),
                               Floats(64), Flux());
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->request.output_format(), v1::OUTPUT_PNG);
  ASSERT_TRUE(call->request.has_png_compression());
  EXPECT_EQ(call->request.png_compression(), 0);
}

TEST(RemoteDecodeTest, NamesTheBadParameter) {
  const std::vector<std::pair<QueryParams, std::string>> cases = {
      {Params({{"shape", "1"}}), "dtype: missing"},
      {Params({{"dtype", "float64"}, {"shape", "1"}}), "\"float64\"; use float16"},
      {Params({{"dtype", "float32"}}), "shape: missing"},
      {Params({{"dtype", "float32"}, {"shape", "-3"}}), "\"-3\" is not a positive integer"},
      {Params({{"dtype", "float32"}, {"dtype", "float16"}, {"shape", "1"}}), "dtype: given more than once"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"shape", "4"}, {"shape", "64"}}), "height/width"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"partial_postprocess", "maybe"}}),
       "\"maybe\" is not True or False"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"output_type", "latent"}}), "use pil, pt or mp4"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"image_format", "gif"}}), "use jpg or png"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"mode", "fast"}}), "use auto, dense, exact or tiled"},
      {Params({{"dtype", "float32"}, {"shape", "2"}, {"shape", "16"}, {"shape", "2"}, {"shape", "2"}}),
       "pil returns one image"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"scaling_factor", "x"}}),
       "scaling_factor: \"x\"; use a finite number"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"output_type", "mp4"}}), "mp4 is for video models"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"fps", "0"}}), "fps"},
      {Params({{"dtype", "float32"}, {"shape", "1"}, {"png_compression", "10"}}),
       "png_compression: \"10\"; use an integer 0..9"},
  };
  for (const auto& [params, message] : cases) {
    absl::StatusOr<RemoteDecodeCall> call = TranslateRemoteDecode(params, "", Flux());
    ASSERT_FALSE(call.ok()) << message;
    EXPECT_EQ(call.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(call.status().message()), HasSubstr(message));
  }
}

TEST(RemoteDecodeTest, RepliesCarryShapeAndDtypeOrJsonErrors) {
  CollectedOutput out;
  out.request_id = "r1";
  out.header.add_shape(1);
  out.header.add_shape(2);
  out.header.add_shape(3);
  out.header.add_shape(4);
  out.header.add_shape(3);
  out.header.set_output_format(v1::OUTPUT_UINT8);
  out.tensor = std::string(72, 'x');
  HttpReply pixels = BuildRemoteDecodeReply(RemoteReply::kPixels, out);  // video frames flattened
  EXPECT_EQ(pixels.status, 200);
  EXPECT_EQ(pixels.body.size(), 72u);
  EXPECT_THAT(pixels.headers, ::testing::Contains(std::make_pair(std::string("shape"), std::string("[2, 3, 4, 3]"))));
  EXPECT_THAT(pixels.headers, ::testing::Contains(std::make_pair(std::string("dtype"), std::string("uint8"))));

  out.status = absl::ResourceExhaustedError("queue \"full\"");
  HttpReply error = BuildRemoteDecodeReply(RemoteReply::kTensor, out);
  EXPECT_EQ(error.status, 429);
  EXPECT_EQ(error.content_type, "application/json");
  EXPECT_EQ(error.body, R"({"code":"RESOURCE_EXHAUSTED","error":"queue \"full\""})");
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
}

}  // namespace
}  // namespace vaedecode::server
