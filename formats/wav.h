#pragma once

// RIFF WAVE files of decoded audio: interleaved samples, 16-bit PCM (the
// samples clamped to [-1, 1] and rounded from x · 32767) or 32-bit IEEE
// float (format tag 3, the samples as they are). Our own writer: PCM has the
// 44-byte canonical header, float an 18-byte fmt chunk and a fact chunk
// (58 bytes), then the data chunk.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::formats {

enum class WavEncoding { kPcm16, kFloat32 };

// A WAV file of `channels` channels, `samples` interleaved (frame-major:
// s[f · channels + c]). INVALID_ARGUMENT for no channels, a sample rate
// outside 1..2^31-1, samples that are not whole frames, a block align or
// byte rate the header cannot hold, or a data chunk past 4 GiB.
absl::StatusOr<std::string> EncodeWav(const std::vector<float>& samples, int64_t channels, int64_t sample_rate,
                                      WavEncoding encoding);

// Writes EncodeWav's bytes to `path` (atomically, as every output file).
absl::Status WriteWav(const std::string& path, const std::vector<float>& samples, int64_t channels, int64_t sample_rate,
                      WavEncoding encoding);

}  // namespace vaedecode::formats
