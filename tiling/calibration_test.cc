#include "tiling/calibration.h"

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "device/counting_cpu_allocator.h"
#include "families/autoencoder_kl/embedded_default.h"

namespace vaedecode::tiling {
namespace {

std::unique_ptr<families::Decoder> SmallDecoder() {
  families::autoencoder_kl::AutoencoderKLConfig c;
  c.block_out_channels = {16, 32, 32};
  c.layers_per_block = 1;
  c.norm_num_groups = 8;
  return families::autoencoder_kl::MakeSeededAutoencoderKL(c, 3);
}

PeakProbe CpuProbe() {
  device::CountingCpuAllocator& a = device::CountingCpuAllocator::Install();
  return {[&a] { a.ResetPeak(); }, [&a] { return a.peak_bytes(); }, [&a] { return a.current_bytes(); }};
}

TEST(Calibrate, PredictsAMeasuredDecodePeakWithin15Percent) {
  auto decoder = SmallDecoder();
  const PeakProbe probe = CpuProbe();
  absl::StatusOr<PeakProfile> profile = Calibrate(*decoder, probe, {8, 16, 24}, "cpu");
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->peaks.size(), 3u);
  EXPECT_GT(profile->bytes_per_latent, 0);

  // A decode at a size calibration never saw (non-square): its real peak.
  at::manual_seed(1);
  const at::Tensor z = at::randn({1, 4, 20, 28});
  families::DenseOps ops;
  const int64_t before = probe.current_bytes();
  probe.reset_peak();
  decoder->Decode(z, ops);
  const double measured = static_cast<double>(probe.peak_bytes() - before);
  const double predicted = profile->Predict(20 * 28);
  EXPECT_GE(predicted, measured * 0.85) << "predicted " << predicted << " measured " << measured;
  EXPECT_LE(predicted, measured * 1.15) << "predicted " << predicted << " measured " << measured;
}

TEST(Calibrate, AttentionScoresCountQuadraticallyAtSizesCalibrationNeverSaw) {
  // This narrow decoder's mid-block attention holds a tokens x tokens score
  // matrix; at 72x88 latents (6336 tokens) it dominates the decode's peak,
  // which a per-latent cost from 8..24-latent tiles cannot foresee.
  auto decoder = SmallDecoder();
  const PeakProbe probe = CpuProbe();
  // The sides a CPU worker calibrates with.
  absl::StatusOr<PeakProfile> profile = Calibrate(*decoder, probe, CalibrationSides(c10::Device(c10::kCPU)), "cpu");
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->attention_transient.size(), 2u);
  at::manual_seed(2);
  const at::Tensor z = at::randn({1, 4, 72, 88});
  families::DenseOps ops;
  const int64_t before = probe.current_bytes();
  probe.reset_peak();
  decoder->Decode(z, ops);
  const double measured = static_cast<double>(probe.peak_bytes() - before);
  const double predicted = profile->Predict(72 * 88);
  EXPECT_GE(predicted, measured * 0.85) << "predicted " << predicted << " measured " << measured;
  EXPECT_LE(predicted, measured * 1.3) << "predicted " << predicted << " measured " << measured;
}

TEST(LoadOrCalibrate, CachesTheProfileAndRecalibratesWhenMissing) {
  auto decoder = SmallDecoder();
  const PeakProbe probe = CpuProbe();
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/profiles";
  std::filesystem::remove_all(dir);
  int decodes = 0;
  PeakProbe counting = probe;
  counting.reset_peak = [&] {
    ++decodes;
    probe.reset_peak();
  };
  // A calibration resets the peak once per decode and once per attention call.
  absl::StatusOr<PeakProfile> first = LoadOrCalibrate(*decoder, counting, {8, 16}, "cpu", dir);
  ASSERT_TRUE(first.ok()) << first.status();
  const int per_calibration = decodes;
  EXPECT_GE(per_calibration, 2);
  absl::StatusOr<PeakProfile> second = LoadOrCalibrate(*decoder, counting, {8, 16}, "cpu", dir);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(decodes, per_calibration) << "the cached profile was not used";
  EXPECT_DOUBLE_EQ(second->attention_bytes_per_latent_pair, first->attention_bytes_per_latent_pair);
  EXPECT_DOUBLE_EQ(second->bytes_per_latent, first->bytes_per_latent);
  // Another dtype or backend is another key.
  EXPECT_NE(ProfileKey(*decoder, "cuda"), first->key);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(LoadOrCalibrate(*decoder, counting, {8, 16}, "cpu", dir).ok());
  EXPECT_EQ(decodes, 2 * per_calibration);
  // GPU backends name the GPU model ("cuda/NVIDIA H200"): still one cache file.
  ASSERT_TRUE(LoadOrCalibrate(*decoder, counting, {8, 16}, "cuda/NVIDIA H200", dir).ok());
  ASSERT_TRUE(LoadOrCalibrate(*decoder, counting, {8, 16}, "cuda/NVIDIA H200", dir).ok());
  EXPECT_EQ(decodes, 3 * per_calibration) << "the GPU backend's profile was not cached";
}

// A poisoned cache (valid JSON, absurd numbers: fixed_bytes 1e15 refused
// every request; coefficients of 1e15 overflowed the memory model's int64
// and admitted everything) is recalibrated, not trusted; a cache folder that
// cannot be written is said.
TEST(LoadOrCalibrate, RecalibratesAnImplausibleCacheAndSaysWhenItCannotWriteOne) {
  auto decoder = SmallDecoder();
  const PeakProbe probe = CpuProbe();
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/poisoned";
  std::filesystem::remove_all(dir);
  absl::StatusOr<PeakProfile> good = LoadOrCalibrate(*decoder, probe, {8, 16}, "cpu", dir);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(PlausibleProfile(*good));
  const std::string file = dir + "/" + std::filesystem::directory_iterator(dir)->path().filename().string();
  for (const char* field : {"fixed_bytes", "bytes_per_latent", "attention_bytes_per_latent_pair"}) {
    std::ifstream in(file);
    nlohmann::json j = nlohmann::json::parse(in);
    j[field] = 1e15;
    std::ofstream(file) << j.dump();
    absl::StatusOr<PeakProfile> reloaded = LoadOrCalibrate(*decoder, probe, {8, 16}, "cpu", dir);
    ASSERT_TRUE(reloaded.ok()) << reloaded.status();
    EXPECT_TRUE(PlausibleProfile(*reloaded)) << field;
    EXPECT_DOUBLE_EQ(reloaded->fixed_bytes, good->fixed_bytes) << field;
  }
  PeakProfile negative = *good;
  negative.bytes_per_latent = -1;
  EXPECT_FALSE(PlausibleProfile(negative));

  std::string warning;
  const std::string unwritable = std::string(std::getenv("TEST_TMPDIR")) + "/a_file";
  std::ofstream(unwritable) << "not a folder";
  ASSERT_TRUE(LoadOrCalibrate(*decoder, probe, {8, 16}, "cpu", unwritable + "/profiles", &warning).ok());
  EXPECT_THAT(warning, ::testing::HasSubstr("cannot write the profile cache"));
}

}  // namespace
}  // namespace vaedecode::tiling
