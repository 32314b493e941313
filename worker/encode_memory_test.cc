// The encode memory model against measured peaks: calibrated on small
// images, it must cover a larger encode's measured peak (dense, and a clip)
// without overstating it by more than its headroom and fit slack; and the
// busiest exact band is the first band with a halo row each side.

#include "worker/encode_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "device/counting_cpu_allocator.h"
#include "families/builtin_families.h"
#include "tests/fixtures/fixture_paths.h"
#include "worker/encode_job.h"

namespace vaedecode::worker {
namespace {

tiling::PeakProbe CpuProbe() {
  device::CountingCpuAllocator& a = device::CountingCpuAllocator::Install();
  return {[&a] { a.ResetPeak(); }, [&a] { return a.peak_bytes(); }, [&a] { return a.current_bytes(); }};
}

double MeasuredPeak(families::Encoder& encoder, const tiling::PeakProbe& probe, const std::vector<int64_t>& shape) {
  at::manual_seed(1);
  const at::Tensor image = at::rand(shape) * 2 - 1;
  families::DenseOps dense;
  probe.reset_peak();
  const int64_t live = probe.current_bytes();
  absl::StatusOr<at::Tensor> moments = EncodePrepared(encoder, image, dense);
  EXPECT_TRUE(moments.ok()) << moments.status();
  return static_cast<double>(probe.peak_bytes() - live);
}

struct Case {
  std::string fixture;
  std::vector<int64_t> shape;  // larger than every calibration image
};

TEST(EncodeMemory, CoversMeasuredPeaksOfLargerEncodes) {
  const tiling::PeakProbe probe = CpuProbe();
  for (const Case& c : std::vector<Case>{{"sd_kl", {1, 3, 160, 128}},             // attention at 40x32 latents
                                         {"sd_kl", {2, 3, 96, 96}},               // batch 2
                                         {"wan21", {1, 3, 9, 256, 256}},          // 3 chunks through the cache
                                         {"ltx2_full", {1, 3, 17, 1024, 1024}},   // the whole clip at once
                                         {"minimax_h3", {1, 3, 2, 256, 256}}}) {  // 2 frames: one whole clip
    absl::StatusOr<std::unique_ptr<families::Encoder>> encoder =
        families::BuiltinFamilies().LoadEncoder(testing::FixturePath(c.fixture), {});
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    absl::StatusOr<EncodePeakModel> model = CalibrateEncodePeak(**encoder, probe);
    ASSERT_TRUE(model.ok()) << model.status();
    const double measured = MeasuredPeak(**encoder, probe, c.shape);
    const double predicted =
        static_cast<double>(PredictEncodePeak(**encoder, *model, c.shape, c.shape[c.shape.size() - 2]));
    std::cout << c.fixture << " " << c.shape.size() << "-D: measured " << measured / 1048576.0 << " MiB, predicted "
              << predicted / 1048576.0 << " MiB\n";
    EXPECT_GE(predicted, measured) << c.fixture;
    EXPECT_LE(predicted, 2.5 * measured) << c.fixture;  // headroom, and a conservative attention term
  }
}

TEST(EncodeMemory, TheBusiestExactBandIsTheFirstWithItsHalo) {
  absl::StatusOr<std::unique_ptr<families::Encoder>> encoder =
      families::BuiltinFamilies().LoadEncoder(testing::FixturePath("sd_kl"), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  // sd_kl halves twice: 100 rows are 25 latent rows, 13 + 12 over 2 ranks.
  EXPECT_EQ(ExactBandRows(**encoder, 100, 2), 13 * 4 + 2);
  EXPECT_EQ(ExactBandRows(**encoder, 100, 1), 100);
}

}  // namespace
}  // namespace vaedecode::worker
