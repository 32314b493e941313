#include "server/session_requests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/fuzz_models.h"
#include "server/mode_selection.h"

namespace vaedecode::server {
namespace {

using ::testing::HasSubstr;

v1::SessionOpen OpenOf(const v1::ModelInfo& model, int64_t side) {
  v1::SessionOpen open;
  open.set_model(model.name());
  open.set_latent_dtype(v1::FLOAT32);
  open.set_output_format(v1::OUTPUT_FLOAT32);
  open.set_mode(v1::MODE_DENSE);
  for (int64_t d : {int64_t{1}, model.latent_channels(), side, side}) open.add_shape(d);
  return open;
}

// A one-latent-frame request of the open's geometry with `frames` frames.
v1::DecodeRequest RequestOf(const v1::SessionOpen& open, int64_t frames) {
  v1::DecodeRequest request = SessionChunkRequest(open, open.mode(), 0);
  for (int64_t d : {open.shape(0), open.shape(1), frames, open.shape(2), open.shape(3)}) {
    request.mutable_latent()->add_shape(d);
  }
  return request;
}

// A windowed decoder's chunk (MiniMax-H3's) returns no frame until a window's
// latents have come, then a window's, at the clip's end also the overlap
// (session_chunk_frames, 22 here): a session is admitted for the shortest
// clip with that many frames (7 latent frames by the table), its memory for
// a window (peak_latent_frames), not for a one-frame clip.
TEST(ValidateSessionOpen, AWindowedModelIsAdmittedForTheFramesAndMemoryOfAWindow) {
  v1::ModelInfo windows = FuzzModel(4);
  ASSERT_TRUE(windows.session_holds_clip_end());
  ASSERT_EQ(windows.peak_latent_frames(), 3);
  ASSERT_EQ(windows.session_chunk_frames(), 22);
  windows.set_peak_bytes_per_latent(1000);
  const v1::SessionOpen open = OpenOf(windows, 4);
  ASSERT_EQ(PredictOutputSize(RequestOf(open, 7), windows).frames, 22);
  const int64_t window_pixels = PredictOutputSize(RequestOf(open, 7), windows).pixels();
  ASSERT_LT(PredictOutputSize(RequestOf(open, 1), windows).pixels(), window_pixels);  // a one-frame clip's

  AdmissionLimits limits;
  limits.max_output_pixels = window_pixels;
  absl::StatusOr<SessionPlan> plan = ValidateSessionOpen(open, windows, 1, limits, int64_t{1} << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_peak_bytes, EstimatePeaks(RequestOf(open, 7), windows, 1).dense);
  EXPECT_GT(plan->chunk_peak_bytes, EstimatePeaks(RequestOf(open, 1), windows, 1).dense);

  limits.max_output_pixels = window_pixels - 1;
  const absl::Status refused = ValidateSessionOpen(open, windows, 1, limits, int64_t{1} << 20).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("--max_output_pixels"));
}

// A causal decoder's one-frame chunks return temporal_factor frames each
// after the first: admitted for the shortest clip with as many (2 latent
// frames make 5), not a one-frame clip's 1.
TEST(ValidateSessionOpen, ACausalDecoderIsAdmittedForTheFramesOfAChunkAfterTheFirst) {
  const v1::ModelInfo& causal = FuzzModel(2);
  ASSERT_EQ(causal.session_chunk_frames(), 4);
  const v1::SessionOpen open = OpenOf(causal, 4);
  AdmissionLimits limits;
  limits.max_output_pixels = PredictOutputSize(RequestOf(open, 2), causal).pixels();
  EXPECT_TRUE(ValidateSessionOpen(open, causal, 1, limits, int64_t{1} << 20).ok());
  limits.max_output_pixels -= 1;
  EXPECT_EQ(ValidateSessionOpen(open, causal, 1, limits, int64_t{1} << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vaedecode::server
