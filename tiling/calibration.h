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
#include "tiling/planner.h"

namespace vaedecode::tiling {

struct PeakProbe {
  std::function<void()> reset_peak;
  std::function<int64_t()> peak_bytes;     // since the last reset
  std::function<int64_t()> current_bytes;  // live now
};

// A decode's peak is the larger of two phases:
//   convolutions:  fixed_bytes + bytes_per_latent · area
//   attention:     attention_fixed_bytes + attention_bytes_per_latent · area
//                  + attention_bytes_per_latent_pair · queries · keys
// bytes_per_latent is the worst marginal cost of the whole decode's peak
// between consecutive measured sides, fixed_bytes the rest of the smallest
// measurement. The attention phase is measured on its own (what is live when
// an attention call starts, plus the call's transient memory): its growth
// beyond linear is the score matrix (queries × keys), which small
// calibration tiles cannot show in the decode's peak but which dominates
// large tiles and exact bands (a band's queries against every key). Kernels
// that never hold the scores (fused attention) measure a zero pair term.
struct PeakProfile {
  std::string key;  // model config hash, dtype, backend
  double bytes_per_latent = 0;
  double fixed_bytes = 0;
  double attention_fixed_bytes = 0;
  double attention_bytes_per_latent = 0;
  double attention_bytes_per_latent_pair = 0;
  std::vector<int64_t> sides;               // square tile sides measured (latents)
  std::vector<double> peaks;                // decode peak (bytes above live) at each side
  std::vector<double> attention_live;       // live bytes when attention starts, at each side
  std::vector<double> attention_transient;  // largest attention call's own peak, at each side

  // Peak of a decode whose queries cover `latents` and whose attention keys
  // cover `key_latents` (the same for a whole-image or tile decode).
  double Predict(int64_t latents, int64_t key_latents) const;
  double Predict(int64_t latents) const { return Predict(latents, latents); }
  // The fitted figures, as the memory model takes them.
  PeakCosts costs() const {
    return {fixed_bytes, bytes_per_latent, attention_fixed_bytes, attention_bytes_per_latent,
            attention_bytes_per_latent_pair};
  }
};

// A probe reading the process's device memory accounting.
PeakProbe ProbeOf(device::DeviceMemory& memory);

// Square tile sides calibration measures on `device` (larger on GPUs, where
// attention's growing share shows only at larger tiles).
std::vector<int64_t> CalibrationSides(const c10::Device& device);

// Where profiles are cached by default: $HOME/.cache/vaedecode/profiles.
std::string DefaultProfileDir();

// A decoder's layout facts for the planner (spatial factor, stock tiles),
// without peaks: enough for the out-of-memory ladder.
FamilyGeometry DecoderGeometry(const families::Decoder& decoder);

// The memory model of a model with this measured profile.
MemoryModel MemoryModelOf(const families::ModelInfo& info, const PeakProfile& profile);

// The planner's geometry for `decoder` with a measured profile, for
// `latent` (VAE space).
FamilyGeometry PlanningGeometry(const families::Decoder& decoder, const PeakProfile& profile,
                                const LatentExtent& latent);

// Identifies what a profile is valid for.
std::string ProfileKey(const families::Decoder& decoder, const std::string& backend);

// Decodes a zero latent of each side (at least two sides, ascending; batch 1,
// 1 frame for video) and fits the profile. Errors are the decode's.
absl::StatusOr<PeakProfile> Calibrate(families::Decoder& decoder, const PeakProbe& probe,
                                      const std::vector<int64_t>& sides, const std::string& backend);

// The profile cached in `dir` for this key, or a new calibration saved
// there. An unreadable, stale or implausible cache file (a coefficient that
// is not finite, negative, or beyond what any device holds: see
// PlausibleProfile) is replaced. A cache that cannot be written costs a
// recalibration at the next start: `cache_warning` (when given) says why.
absl::StatusOr<PeakProfile> LoadOrCalibrate(families::Decoder& decoder, const PeakProbe& probe,
                                            const std::vector<int64_t>& sides, const std::string& backend,
                                            const std::string& dir, std::string* cache_warning = nullptr);

// Every coefficient finite, non-negative and within what a device can hold
// (fixed bytes up to 2^40, per latent up to 2^30, per latent pair up to
// 2^20), so the memory model's predictions stay far inside int64.
bool PlausibleProfile(const PeakProfile& profile);

}  // namespace vaedecode::tiling
