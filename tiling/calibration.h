#pragma once

// Measured decode peaks: how many bytes a decode of this model, dtype and
// backend needs per latent of tile area, measured on the real decoder over a
// few tile sides (the worst figure is kept: attention grows faster than
// area), and cached in a profile file so a worker calibrates a model once.
//
// Backend-agnostic: the caller supplies how to read and reset the peak (the
// counting CPU allocator here, the CUDA caching allocator on GPUs).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "device/device_memory.h"
#include "families/decoder.h"

namespace vaedecode::tiling {

struct PeakProbe {
  std::function<void()> reset_peak;
  std::function<int64_t()> peak_bytes;     // since the last reset
  std::function<int64_t()> current_bytes;  // live now
};

// peak(area) ≈ fixed_bytes + bytes_per_latent · area, where bytes_per_latent
// is the worst marginal cost between consecutive measured sides (attention
// grows faster than area, so the largest sides dominate) and fixed_bytes the
// rest of the smallest measurement (buffers that do not scale with the tile).
struct PeakProfile {
  std::string key;                 // model config hash, dtype, backend
  double bytes_per_latent = 0;
  double fixed_bytes = 0;
  std::vector<int64_t> sides;      // square tile sides measured (latents)
  std::vector<double> peaks;       // decode peak (bytes above live) at each side

  double Predict(int64_t latents) const { return fixed_bytes + bytes_per_latent * static_cast<double>(latents); }
};

// A probe reading the process's device memory accounting.
PeakProbe ProbeOf(device::DeviceMemory& memory);

// Square tile sides calibration measures on `device` (larger on GPUs, where
// attention's growing share shows only at larger tiles).
std::vector<int64_t> CalibrationSides(const c10::Device& device);

// Where profiles are cached by default: $HOME/.cache/vaedecode/profiles.
std::string DefaultProfileDir();

// Identifies what a profile is valid for.
std::string ProfileKey(const families::Decoder& decoder, const std::string& backend);

// Decodes a zero latent of each side (at least two sides, ascending; batch 1,
// 1 frame for video) and fits the profile. Errors are the decode's.
absl::StatusOr<PeakProfile> Calibrate(families::Decoder& decoder, const PeakProbe& probe,
                                      const std::vector<int64_t>& sides, const std::string& backend);

// The profile cached in `dir` for this key, or a new calibration saved
// there. An unreadable or stale cache file is replaced.
absl::StatusOr<PeakProfile> LoadOrCalibrate(families::Decoder& decoder, const PeakProbe& probe,
                                            const std::vector<int64_t>& sides, const std::string& backend,
                                            const std::string& dir);

}  // namespace vaedecode::tiling
