#include "formats/wav.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "formats/file_io.h"
#include "rpc/status_macros.h"

namespace vaedecode::formats {
namespace {

void PutU16(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
}

void PutU32(std::string& out, uint32_t v) {
  PutU16(out, v & 0xffff);
  PutU16(out, v >> 16);
}

}  // namespace

absl::StatusOr<std::string> EncodeWav(const std::vector<float>& samples, int64_t channels, int64_t sample_rate,
                                      WavEncoding encoding) {
  if (channels < 1 || channels > 0xffff)
    return absl::InvalidArgumentError(absl::StrCat("WAV: ", channels, " channels"));
  if (sample_rate < 1 || sample_rate > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("WAV: sample rate ", sample_rate));
  }
  if (samples.size() % static_cast<size_t>(channels) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("WAV: ", samples.size(), " samples are not whole frames of ", channels, " channels"));
  }
  const uint32_t bytes_per_sample = encoding == WavEncoding::kPcm16 ? 2 : 4;
  const uint64_t block_align = static_cast<uint64_t>(channels) * bytes_per_sample;
  const uint64_t byte_rate = static_cast<uint64_t>(sample_rate) * block_align;
  if (block_align > 0xffff || byte_rate > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("WAV: ", channels, " channels at ", sample_rate,
                                                   " Hz do not fit a WAV header's block align and byte rate"));
  }
  const uint64_t data_bytes = static_cast<uint64_t>(samples.size()) * bytes_per_sample;
  if (data_bytes > std::numeric_limits<uint32_t>::max() - 58) {
    return absl::InvalidArgumentError(
        absl::StrCat("WAV: ", data_bytes, " bytes of samples exceed a RIFF file's 4 GiB"));
  }
  // PCM: the canonical 16-byte fmt chunk. IEEE float: an 18-byte one
  // (cbSize 0) and a fact chunk with the frame count, as the format asks of
  // non-PCM data (strict readers want both).
  const bool pcm = encoding == WavEncoding::kPcm16;
  const uint32_t header_bytes = pcm ? 44 : 58;
  std::string out;
  out.reserve(header_bytes + data_bytes);
  out += "RIFF";
  PutU32(out, static_cast<uint32_t>(header_bytes - 8 + data_bytes));
  out += "WAVEfmt ";
  PutU32(out, pcm ? 16 : 18);  // fmt chunk size
  PutU16(out, pcm ? 1 : 3);    // PCM, IEEE float
  PutU16(out, static_cast<uint32_t>(channels));
  PutU32(out, static_cast<uint32_t>(sample_rate));
  PutU32(out, static_cast<uint32_t>(byte_rate));
  PutU16(out, static_cast<uint32_t>(block_align));
  PutU16(out, bytes_per_sample * 8);  // bits per sample
  if (!pcm) {
    PutU16(out, 0);  // cbSize
    out += "fact";
    PutU32(out, 4);
    PutU32(out, static_cast<uint32_t>(samples.size() / static_cast<size_t>(channels)));
  }
  out += "data";
  PutU32(out, static_cast<uint32_t>(data_bytes));
  for (float s : samples) {
    if (encoding == WavEncoding::kPcm16) {
      const float clamped = std::isnan(s) ? 0.0f : std::clamp(s, -1.0f, 1.0f);
      const int32_t v = static_cast<int32_t>(std::lround(clamped * 32767.0f));
      PutU16(out, static_cast<uint16_t>(static_cast<int16_t>(v)));
    } else {
      uint32_t bits;
      std::memcpy(&bits, &s, 4);
      PutU32(out, bits);
    }
  }
  return out;
}

absl::Status WriteWav(const std::string& path, const std::vector<float>& samples, int64_t channels, int64_t sample_rate,
                      WavEncoding encoding) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeWav(samples, channels, sample_rate, encoding));
  return WriteFileAtomically(path, {ByteChunk{bytes.data(), bytes.size()}});
}

}  // namespace vaedecode::formats
