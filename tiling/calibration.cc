#include "tiling/calibration.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace vaedecode::tiling {

PeakProbe ProbeOf(device::DeviceMemory& memory) {
  return {[&memory] { memory.ResetPeak(); }, [&memory] { return memory.peak_bytes(); },
          [&memory] { return memory.current_bytes(); }};
}

std::vector<int64_t> CalibrationSides(const c10::Device& device) {
  return device.is_cuda() ? std::vector<int64_t>{16, 32} : std::vector<int64_t>{8, 16};
}

std::string DefaultProfileDir() {
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr && *home != '\0' ? home : "/tmp", "/.cache/vaedecode/profiles");
}

std::string ProfileKey(const families::Decoder& decoder, const std::string& backend) {
  const families::ModelInfo& info = decoder.info();
  const size_t hash = std::hash<std::string>{}(info.diffusers_class + "\n" + info.config_json);
  return absl::StrFormat("%s-%016x-%s-%s", info.family, hash, c10::toString(decoder.dtype()), backend);
}

absl::StatusOr<PeakProfile> Calibrate(families::Decoder& decoder, const PeakProbe& probe,
                                      const std::vector<int64_t>& sides, const std::string& backend) {
  if (sides.size() < 2 || !std::is_sorted(sides.begin(), sides.end())) {
    return absl::InvalidArgumentError("calibration needs at least two ascending tile sides");
  }
  PeakProfile profile;
  profile.key = ProfileKey(decoder, backend);
  const families::ModelInfo& info = decoder.info();
  families::DenseOps ops;
  for (int64_t side : sides) {
    std::vector<int64_t> shape = {1, info.latent_channels, side, side};
    if (info.is_video) shape.insert(shape.begin() + 2, 1);
    double peak = 0;
    try {
      const at::Tensor z = at::zeros(shape, at::TensorOptions().dtype(decoder.dtype()).device(decoder.device()));
      const int64_t before = probe.current_bytes();
      probe.reset_peak();
      decoder.Decode(z, ops);
      peak = static_cast<double>(probe.peak_bytes() - before);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("calibration decode at side ", side, " failed: ",
                                              std::string(e.what()).substr(0, 200)));
    }
    profile.sides.push_back(side);
    profile.peaks.push_back(peak);
  }
  for (size_t i = 1; i < sides.size(); ++i) {
    const double d_area = static_cast<double>(sides[i] * sides[i] - sides[i - 1] * sides[i - 1]);
    profile.bytes_per_latent = std::max(profile.bytes_per_latent, (profile.peaks[i] - profile.peaks[i - 1]) / d_area);
  }
  profile.fixed_bytes =
      std::max(0.0, profile.peaks[0] - profile.bytes_per_latent * static_cast<double>(sides[0] * sides[0]));
  return profile;
}

absl::StatusOr<PeakProfile> LoadOrCalibrate(families::Decoder& decoder, const PeakProbe& probe,
                                            const std::vector<int64_t>& sides, const std::string& backend,
                                            const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string key = ProfileKey(decoder, backend);
  // Backends carry GPU model names ("cuda/NVIDIA H200"): one plain file name.
  std::string file = key;
  for (char& c : file) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  const fs::path path = fs::path(dir) / (file + ".json");
  {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      const std::string body = text.str();
      const nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("key", "") == key && j.contains("bytes_per_latent") &&
          j["bytes_per_latent"].is_number() && j.contains("fixed_bytes") && j["fixed_bytes"].is_number() &&
          j.contains("sides") && j["sides"] == nlohmann::json(sides)) {
        PeakProfile p;
        p.key = key;
        p.bytes_per_latent = j["bytes_per_latent"].get<double>();
        p.fixed_bytes = j["fixed_bytes"].get<double>();
        p.sides = sides;
        if (j.contains("peaks") && j["peaks"].is_array()) {
          for (const auto& v : j["peaks"]) p.peaks.push_back(v.is_number() ? v.get<double>() : 0.0);
        }
        return p;
      }
    }
  }
  absl::StatusOr<PeakProfile> profile = Calibrate(decoder, probe, sides, backend);
  if (!profile.ok()) return profile;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const nlohmann::json j = {{"key", key},
                            {"bytes_per_latent", profile->bytes_per_latent},
                            {"fixed_bytes", profile->fixed_bytes},
                            {"sides", profile->sides},
                            {"peaks", profile->peaks}};
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << j.dump(2);
  fs::rename(tmp, path, ec);  // a failed cache write only costs a recalibration later
  return profile;
}

}  // namespace vaedecode::tiling
