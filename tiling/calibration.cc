#include "tiling/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/status_macros.h"

namespace vaedecode::tiling {

PeakProbe ProbeOf(device::DeviceMemory& memory) {
  return {[&memory] { memory.ResetPeak(); }, [&memory] { return memory.peak_bytes(); },
          [&memory] { return memory.current_bytes(); }};
}

std::vector<int64_t> CalibrationSides(const c10::Device& device) {
  // CPU convolutions (oneDNN) take a fixed workspace at small tiles and a
  // copy of the activation at larger ones: below 16 latents the fixed part
  // hides the per-latent slope.
  return device.is_cuda() ? std::vector<int64_t>{16, 32} : std::vector<int64_t>{16, 24};
}

std::string DefaultProfileDir() {
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr && *home != '\0' ? home : "/tmp", "/.cache/vaedecode/profiles");
}

double PeakProfile::Predict(int64_t latents, int64_t key_latents) const {
  const double q = static_cast<double>(latents), k = static_cast<double>(key_latents);
  const double scores = attention_bytes_per_latent_pair * q * k;
  return std::max(fixed_bytes + bytes_per_latent * q, attention_fixed_bytes + attention_bytes_per_latent * q + scores);
}

FamilyGeometry DecoderGeometry(const families::Decoder& decoder) {
  FamilyGeometry g;
  g.spatial_factor = decoder.info().spatial_factor;
  g.stock_tile = decoder.info().stock_tile;
  g.stock_stride = decoder.info().stock_stride;
  return g;
}

MemoryModel MemoryModelOf(const families::ModelInfo& info, const PeakProfile& profile) {
  return {profile.costs(), info.temporal_factor, info.peak_latent_frames};
}

FamilyGeometry PlanningGeometry(const families::Decoder& decoder, const PeakProfile& profile,
                                const LatentExtent& latent) {
  FamilyGeometry g = DecoderGeometry(decoder);
  g.memory = MemoryModelOf(decoder.info(), profile);
  g.latent = latent;
  return g;
}

namespace {

// DenseOps that also measure every attention call's transient memory (the
// peak during the call above what was live when it began). The probe's peak
// window restarts at each call, so the meter keeps the decode's peak from
// before it.
class AttentionMeter final : public families::ForwardingOps {
 public:
  explicit AttentionMeter(const PeakProbe& probe) : ForwardingOps(SharedDense()), probe_(probe) {}

  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const families::TokenLayout& layout) override {
    return Measured([&] { return inner().Attention(q, k, v, layout); });
  }

  int64_t decode_peak() const { return std::max(earlier_peak_, probe_.peak_bytes()); }
  // The most bytes live when an attention call began, and the largest
  // call's own peak above that (0 and 0 for decoders without attention).
  int64_t largest_live() const { return largest_live_; }
  int64_t largest_transient() const { return largest_transient_; }

 private:
  template <typename Call>
  at::Tensor Measured(const Call& call) {
    earlier_peak_ = std::max(earlier_peak_, probe_.peak_bytes());
    const int64_t before = probe_.current_bytes();
    probe_.reset_peak();
    at::Tensor out = call();
    largest_live_ = std::max(largest_live_, before);
    largest_transient_ = std::max(largest_transient_, probe_.peak_bytes() - before);
    return out;
  }

  // DenseOps are stateless: one instance serves every meter.
  static families::LayerOps& SharedDense() {
    static families::DenseOps* dense = new families::DenseOps();
    return *dense;
  }

  const PeakProbe& probe_;
  int64_t earlier_peak_ = 0;
  int64_t largest_live_ = 0;
  int64_t largest_transient_ = 0;
};

// The worst slope between consecutive points, and the rest of the first.
std::pair<double, double> LinearBound(const std::vector<double>& areas, const std::vector<double>& values) {
  double slope = 0;
  for (size_t i = 1; i < areas.size(); ++i) {
    slope = std::max(slope, (values[i] - values[i - 1]) / (areas[i] - areas[i - 1]));
  }
  return {std::max(0.0, values[0] - slope * areas[0]), slope};
}

}  // namespace

std::string ProfileKey(const families::Decoder& decoder, const std::string& backend) {
  const families::ModelInfo& info = decoder.info();
  const size_t hash = std::hash<std::string>{}(info.diffusers_class + "\n" + info.config_json);
  // Kernels, and so peaks, change with LibTorch: profiles are per version.
  return absl::StrFormat("%s-%016x-%s-%s-torch%s", info.family, hash, c10::toString(decoder.dtype()), backend,
                         TORCH_VERSION);
}

namespace {

// An audio VAE is calibrated on latents [1, C, L(, M)] whose length L stands
// for a side: its "area" is L (the memory model's rows, one column).
int64_t AudioLength(const families::ModelInfo& info, int64_t side) {
  return side * std::max<int64_t>(1, info.min_latent_frames);
}

}  // namespace

absl::StatusOr<PeakProfile> Calibrate(families::Decoder& decoder, const PeakProbe& probe,
                                      const std::vector<int64_t>& sides, const std::string& backend) {
  if (sides.size() < 2 ||
      std::adjacent_find(sides.begin(), sides.end(), std::greater_equal<int64_t>()) != sides.end()) {
    return absl::InvalidArgumentError("calibration needs at least two strictly ascending tile sides");
  }
  PeakProfile profile;
  profile.key = ProfileKey(decoder, backend);
  const families::ModelInfo& info = decoder.info();
  // A video probe has the fewest frames the decoder takes, or as many as its
  // peak saturates at (a windowed decoder's full window); its peaks are
  // stored per frame-factor unit, as the memory model scales them.
  const int64_t frames = info.is_video ? std::max<int64_t>({1, info.min_latent_frames, info.peak_latent_frames}) : 1;
  const double frame_factor = FrameFactor(MemoryModelOf(info, profile), frames);
  for (int64_t side : sides) {
    std::vector<int64_t> shape = {1, info.latent_channels, side, side};
    if (info.is_video) shape.insert(shape.begin() + 2, frames);
    if (info.is_audio) {
      shape = {1, info.latent_channels, AudioLength(info, side)};
      if (info.latent_bins > 0) shape.push_back(info.latent_bins);
    }
    double peak = 0, attention_live = 0, attention_transient = 0;
    try {
      const at::Tensor z = at::zeros(shape, at::TensorOptions().dtype(decoder.dtype()).device(decoder.device()));
      const int64_t before = probe.current_bytes();
      probe.reset_peak();
      AttentionMeter ops(probe);
      decoder.Decode(z, ops);
      peak = static_cast<double>(ops.decode_peak() - before) / frame_factor;
      if (ops.largest_transient() > 0) {
        attention_live = static_cast<double>(std::max<int64_t>(0, ops.largest_live() - before)) / frame_factor;
        attention_transient = static_cast<double>(ops.largest_transient()) / frame_factor;
      }
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("calibration decode at side ", side, " failed: ", std::string(e.what()).substr(0, 200)));
    }
    profile.sides.push_back(side);
    profile.peaks.push_back(peak);
    profile.attention_live.push_back(attention_live);
    profile.attention_transient.push_back(attention_transient);
  }
  std::vector<double> areas, transient_per_latent;
  for (size_t i = 0; i < sides.size(); ++i) {
    areas.push_back(static_cast<double>(info.is_audio ? AudioLength(info, sides[i]) : sides[i] * sides[i]));
    transient_per_latent.push_back(profile.attention_transient[i] / areas.back());
  }
  std::tie(profile.fixed_bytes, profile.bytes_per_latent) = LinearBound(areas, profile.peaks);
  // Attention phase: live bytes are linear in the area; the call's transient
  // is p·area + q·area², so its per-latent cost is linear in the area.
  double live_per_latent = 0, p = 0;
  std::tie(profile.attention_fixed_bytes, live_per_latent) = LinearBound(areas, profile.attention_live);
  std::tie(p, profile.attention_bytes_per_latent_pair) = LinearBound(areas, transient_per_latent);
  profile.attention_bytes_per_latent = live_per_latent + p;
  return profile;
}

bool PlausibleProfile(const PeakProfile& p) {
  const auto within = [](double v, double bound) { return std::isfinite(v) && v >= 0 && v <= bound; };
  constexpr double kFixed = 1ull << 40, kPerLatent = 1ull << 30, kPerPair = 1ull << 20;
  return within(p.fixed_bytes, kFixed) && within(p.attention_fixed_bytes, kFixed) &&
         within(p.bytes_per_latent, kPerLatent) && within(p.attention_bytes_per_latent, kPerLatent) &&
         within(p.attention_bytes_per_latent_pair, kPerPair);
}

absl::StatusOr<PeakProfile> LoadOrCalibrate(families::Decoder& decoder, const PeakProbe& probe,
                                            const std::vector<int64_t>& sides, const std::string& backend,
                                            const std::string& dir, std::string* cache_warning) {
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
          j.contains("attention_bytes_per_latent_pair") && j["attention_bytes_per_latent_pair"].is_number() &&
          j.contains("attention_bytes_per_latent") && j["attention_bytes_per_latent"].is_number() &&
          j.contains("attention_fixed_bytes") && j["attention_fixed_bytes"].is_number() && j.contains("sides") &&
          j["sides"] == nlohmann::json(sides)) {
        PeakProfile p;
        p.key = key;
        p.bytes_per_latent = j["bytes_per_latent"].get<double>();
        p.fixed_bytes = j["fixed_bytes"].get<double>();
        p.attention_bytes_per_latent_pair = j["attention_bytes_per_latent_pair"].get<double>();
        p.attention_bytes_per_latent = j["attention_bytes_per_latent"].get<double>();
        p.attention_fixed_bytes = j["attention_fixed_bytes"].get<double>();
        p.sides = sides;
        if (j.contains("peaks") && j["peaks"].is_array()) {
          for (const auto& v : j["peaks"]) p.peaks.push_back(v.is_number() ? v.get<double>() : 0.0);
        }
        if (PlausibleProfile(p)) return p;
      }
    }
  }
  ASSIGN_OR_RETURN(PeakProfile profile, Calibrate(decoder, probe, sides, backend));
  std::error_code ec;
  fs::create_directories(dir, ec);
  const nlohmann::json j = {{"key", key},
                            {"bytes_per_latent", profile.bytes_per_latent},
                            {"fixed_bytes", profile.fixed_bytes},
                            {"attention_fixed_bytes", profile.attention_fixed_bytes},
                            {"attention_bytes_per_latent", profile.attention_bytes_per_latent},
                            {"attention_bytes_per_latent_pair", profile.attention_bytes_per_latent_pair},
                            {"attention_live", profile.attention_live},
                            {"attention_transient", profile.attention_transient},
                            {"sides", profile.sides},
                            {"peaks", profile.peaks}};
  // Every rank of a group calibrates the same model at once: each writes its
  // own temporary file (a shared one was renamed away under the others,
  // which then warned), and the last rename wins with the same figures.
  const fs::path tmp = absl::StrCat(path.string(), ".", getpid(), ".tmp");
  std::ofstream out(tmp);
  out << j.dump(2);
  out.close();
  // A failed cache write only costs a recalibration at the next start.
  if (!out) {
    if (cache_warning != nullptr) *cache_warning = absl::StrCat("cannot write the profile cache ", tmp.string());
  } else if (fs::rename(tmp, path, ec); ec) {
    if (cache_warning != nullptr) {
      *cache_warning = absl::StrCat("cannot write the profile cache ", path.string(), ": ", ec.message());
    }
  }
  return profile;
}

}  // namespace vaedecode::tiling
