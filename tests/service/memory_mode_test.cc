// The scheduler's exact / tiled / refuse choice through the real service: two
// CPU ranks with a memory budget each, the embedded SD-1.x-sized model, and
// latents whose measured-peak estimates fall on either side of the free
// memory. The model's own calibrated profile (GetModel) and the group's
// free memory (/metrics) decide; the test derives its expectations from the
// same figures, with wide margins.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "formats/png.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// The embedded model's weights (189 MiB) live inside each rank's budget.
constexpr int64_t kBudgetMib = 189 + 330;

TEST(MemoryModeTest, AutoPicksTiledWhenAShareDoesNotFitAndRefusesWhatCanNeverFit) {
  std::unique_ptr<ServerProcess> server =
      StartServing(RealWorkerFlags("", "cpu:2", 2, {absl::StrCat("--memory_budget_mib=", kBudgetMib)}), {"default"});
  ASSERT_NE(server, nullptr);

  grpc::ClientContext info_ctx;
  v1::GetModelRequest get;
  get.set_name("default");
  v1::ModelInfo model;
  ASSERT_TRUE(server->stub().GetModel(&info_ctx, get, &model).ok());
  ASSERT_GT(model.peak_bytes_per_latent(), 0);
  absl::StatusOr<std::string> metrics = server->ScrapeMetrics();
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const double free_bytes = MetricValue(*metrics, "vaedecode_device_free_bytes", {"device=\"cpu:0\""});
  ASSERT_GT(free_bytes, 0) << *metrics;

  // A tall latent: a 2-rank share (66 of 128 rows) needs far more than the
  // free memory, a 32-latent floor tile far less.
  const auto estimate = [&](double queries, double keys) {
    return std::max(model.fixed_peak_bytes() + 1.25 * model.peak_bytes_per_latent() * queries,
                    model.attention_fixed_bytes() + 1.25 * (model.attention_bytes_per_latent() * queries +
                                                            model.attention_bytes_per_latent_pair() * queries * keys));
  };
  ASSERT_GT(estimate(66 * 24, 128 * 24), 1.2 * free_bytes) << "the budget no longer separates the cases";
  ASSERT_LT(estimate(32 * 24, 32 * 24), 0.8 * free_bytes) << "the budget no longer separates the cases";

  const DecodeOutcome tiled = Decode(server->stub(), SyntheticRequest("default", {1, 4, 128, 24}, "tall"));
  ExpectOk(tiled);
  ASSERT_TRUE(tiled.output.has_header());
  EXPECT_EQ(tiled.output.header().mode(), v1::MODE_TILED) << tiled.output.header().mode_reason();
  EXPECT_THAT(tiled.output.header().tile_plan(), HasSubstr("tiles of"));
  EXPECT_EQ(Shape(tiled.output.header()), (std::vector<int64_t>{1, 3, 1024, 192}));
  const std::vector<float> rows = AsFloats(tiled);
  for (float v : rows) ASSERT_TRUE(std::isfinite(v));

  // The float output streamed row bands while tiles were still decoding; the
  // PNG of the same request is encoded from the finished image. With the
  // same plan both are the same decode: every pixel within one 8-bit level.
  // (Free memory moves by a few MiB between requests, which can move the
  // tile size by a latent: then the two are different seam-free blends, and
  // only close — at least 40 dB.)
  v1::DecodeRequest as_png = SyntheticRequest("default", {1, 4, 128, 24}, "tall");
  as_png.set_output_format(v1::OUTPUT_PNG);
  const DecodeOutcome png = Decode(server->stub(), as_png);
  ExpectOk(png);
  ASSERT_EQ(png.output.images().size(), 1u);
  absl::StatusOr<formats::PngImage> image = formats::DecodePng(png.output.images()[0]);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->width, 192);
  ASSERT_EQ(image->height, 1024);
  const int64_t plane = 1024 * 192;
  int64_t off_by_more = 0;
  double squared = 0;
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t p = 0; p < plane; ++p) {
      const double level = std::round(std::clamp(rows[c * plane + p] / 2.0 + 0.5, 0.0, 1.0) * 255.0);
      const double d = level - image->pixels[p * 3 + c];
      if (std::abs(d) > 1) ++off_by_more;
      squared += d * d;
    }
  }
  const std::string plans =
      absl::StrCat("float32: ", tiled.output.header().tile_plan(), "; png: ", png.output.header().tile_plan());
  if (tiled.output.header().tile_plan() == png.output.header().tile_plan()) {
    EXPECT_EQ(off_by_more, 0) << plans;
  } else {
    const double psnr = 10 * std::log10(255.0 * 255.0 / std::max(1e-12, squared / (3.0 * plane)));
    EXPECT_GE(psnr, 40.0) << plans;
  }

  // Forcing EXACT on the same latent cannot fit: refused with the numbers.
  v1::DecodeRequest exact = SyntheticRequest("default", {1, 4, 128, 24}, "forced-exact");
  exact.set_mode(v1::MODE_EXACT);
  const DecodeOutcome refused = Decode(server->stub(), exact);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("MiB free"));

  // A latent small enough for a 2-rank share goes exact.
  const DecodeOutcome small = Decode(server->stub(), SyntheticRequest("default", {1, 4, 16, 16}, "small"));
  ExpectOk(small);
  ASSERT_TRUE(small.output.has_header());
  EXPECT_EQ(small.output.header().mode(), v1::MODE_EXACT) << small.output.header().mode_reason();

  // A batch so large that even one floor tile can never fit the ranks'
  // budgets: refused at once with the numbers, long before its deadline
  // (waiting for memory the group will never have would hold it for good).
  ASSERT_GT(estimate(16.0 * 32 * 32, 32.0 * 32), 2.0 * free_bytes);  // 16 images of 32x32
  const absl::Time asked = absl::Now();
  const DecodeOutcome never =
      Decode(server->stub(), SyntheticRequest("default", {16, 4, 32, 32}, "too-big"), absl::Seconds(60));
  EXPECT_EQ(never.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << never.status.error_message();
  EXPECT_THAT(never.status.error_message(), HasSubstr("can never be decoded on this server"));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(10));
  // The server still serves.
  ExpectOk(Decode(server->stub(), SyntheticRequest("default", {1, 4, 8, 8}, "after")));
}

// A seeded float image [1, 3, side, side] in [-1, 1] to encode.
v1::EncodeRequest SquareImage(int64_t side) {
  v1::EncodeRequest r;
  r.set_model("sd_kl");
  v1::Tensor* t = r.mutable_image();
  t->set_dtype(v1::FLOAT32);
  for (int64_t d : {int64_t{1}, int64_t{3}, side, side}) t->add_shape(d);
  std::vector<float> pixels(static_cast<size_t>(3 * side * side));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 37) % 200) / 100.0f - 1.0f;
  t->set_data(std::string(reinterpret_cast<const char*>(pixels.data()), pixels.size() * sizeof(float)));
  return r;
}

TEST(MemoryModeTest, EncodesThatWouldNotFitAreRefusedWithTheNumbers) {
  // sd_kl's encoder (16 channels at full resolution) at 768x768 needs far
  // more than the 64 MiB budget of each rank (a 16-channel 768x768 float32
  // activation alone is 36 MiB), even as one of two bands; at 64x64 it
  // needs a few MiB. Its peaks are measured at the first encode.
  const std::string repo = FixtureRepository({"sd_kl"});
  std::unique_ptr<ServerProcess> server =
      StartServing(RealWorkerFlags(repo, "cpu:2", 2, {"--memory_budget_mib=64"}), {"sd_kl"});
  ASSERT_NE(server, nullptr);
  const DecodeOutcome exact = Encode(server->stub(), SquareImage(768));
  EXPECT_EQ(exact.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << exact.status.error_message();
  EXPECT_THAT(exact.status.error_message(), HasSubstr("exact over 2 ranks needs about"));
  EXPECT_THAT(exact.status.error_message(), HasSubstr("MiB free"));
  v1::EncodeRequest dense_request = SquareImage(768);
  dense_request.set_mode(v1::MODE_DENSE);
  const DecodeOutcome dense = Encode(server->stub(), dense_request);
  EXPECT_EQ(dense.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << dense.status.error_message();
  EXPECT_THAT(dense.status.error_message(), HasSubstr("dense (dense was asked for) needs about"));
  // What fits is encoded, exactly over both ranks, by the same server.
  const DecodeOutcome small = Encode(server->stub(), SquareImage(64));
  ASSERT_TRUE(small.status.ok()) << small.status.error_message();
  ASSERT_TRUE(small.stream_error.ok()) << small.stream_error;
  EXPECT_EQ(small.output.header().mode(), v1::MODE_EXACT);
  EXPECT_EQ(Shape(small.output.header()), (std::vector<int64_t>{1, 4, 16, 16}));
}

}  // namespace
}  // namespace vaedecode::testing
