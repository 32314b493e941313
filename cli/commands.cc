#include "cli/commands.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/group_mode.h"
#include "cli/model_loading.h"
#include "device/compute_device.h"
#include "device/device_memory.h"
#include "formats/tensor_file.h"
#include "tiling/calibration.h"
#include "tiling/planner.h"
#include "tiling/tiled_decode.h"
#include "worker/decode_job.h"
#include "worker/exact_decode.h"
#include "worker/runtime_info.h"

namespace vaedecode::cli {
namespace {

constexpr uint64_t kDemoLatentSeed = 7;
constexpr const char* kDemoLatentShape = "1,4,32,32";

// A seeded N(0, 1) latent (SplitMix64 + Box-Muller): the same on every machine.
at::Tensor DemoLatent(const std::vector<int64_t>& shape, uint64_t seed) {
  at::Tensor t = at::empty(shape, at::kFloat);
  float* data = t.data_ptr<float>();
  uint64_t state = seed;
  auto next_unit = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    data[i] = static_cast<float>(std::sqrt(-2.0 * std::log(next_unit())) *
                                 std::cos(6.283185307179586 * next_unit()));
  }
  return t;
}

std::string ShapeText(c10::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

bool EndsWith(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Peak resident memory of this process (the leader's, in exact mode).
int64_t MaxRssMib() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;  // KiB on Linux
}

absl::Status ApplyThreads(const ParsedArgs& args) {
  if (auto threads = args.Get("threads")) {
    int n = 0;
    if (!absl::SimpleAtoi(*threads, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--threads must be a positive integer, got \"", *threads, "\""));
    }
    at::set_num_threads(n);
  }
  return absl::OkStatus();
}

std::string Mib(double bytes) { return absl::StrFormat("%.1f", bytes / 1048576.0); }

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// What a decode produced and the summary line's figures for it.
struct DecodeOutcome {
  at::Tensor sample;
  std::string mode;
  double decode_ms = 0;  // until the device finished (CUDA kernels are asynchronous)
  std::string figures;
};

// Caps the device's allocations at `budget` bytes beyond what is live now
// (the loaded model is not the decode's); 0 leaves it unbounded.
absl::Status ApplyDecodeBudget(device::DeviceMemory& memory, int64_t budget) {
  return budget > 0 ? memory.SetBudget(memory.current_bytes() + budget) : absl::OkStatus();
}

absl::StatusOr<DecodeOutcome> DecodeDense(families::Decoder& decoder, const worker::DecodeJob& job,
                                          device::DeviceMemory& memory, int64_t budget) {
  if (absl::Status s = ApplyDecodeBudget(memory, budget); !s.ok()) return s;
  families::DenseOps ops;
  const int64_t before = memory.current_bytes();
  memory.ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<at::Tensor> sample = worker::RunDecode(decoder, job, ops);
  if (!sample.ok()) return sample.status();
  device::SynchronizeDevice(decoder.device());
  const double ms = MillisecondsSince(start);
  return DecodeOutcome{*sample, "dense", ms,
                       absl::StrCat(" decode_peak_mib=", Mib(memory.peak_bytes() - before), " peak_mib=[",
                                    Mib(memory.peak_bytes()), "]")};
}

// Tiles sized for what the device has free (the budget, when one is set),
// from the model's measured peak profile; out-of-memory retries walk the
// ladder (floor tiles, then stock tiles) as the service does.
absl::StatusOr<DecodeOutcome> DecodeTiled(families::Decoder& decoder, const worker::DecodeJob& job,
                                          device::DeviceMemory& memory, int64_t budget_bytes) {
  if (absl::Status valid = decoder.ValidateLatent(job.latent); !valid.ok()) return valid;
  // Calibration (when no profile is cached yet) runs before the budget applies.
  absl::StatusOr<tiling::PeakProfile> profile =
      tiling::LoadOrCalibrate(decoder, tiling::ProbeOf(memory), tiling::CalibrationSides(decoder.device()),
                              memory.backend(), tiling::DefaultProfileDir());
  if (!profile.ok()) return profile.status();
  // Tiles are cut from the VAE-space latent (a packed raw FLUX.2 latent
  // unpacks to twice the rows and columns), so convert before planning.
  at::Tensor z;
  absl::Status prepared = worker::CatchExceptions("latent conversion", [&] {
    z = job.latent.to(decoder.device());
    if (job.latent_space == families::LatentSpace::kRaw) z = decoder.ToVaeSpace(z.to(at::kFloat));
    z = z.to(decoder.dtype()).contiguous();
  });
  if (!prepared.ok()) return prepared;
  if (absl::Status s = ApplyDecodeBudget(memory, budget_bytes); !s.ok()) return s;
  const tiling::FamilyGeometry geometry = tiling::PlanningGeometry(decoder, *profile, z.size(0));
  const int64_t free = memory.free_bytes();
  // The blended float32 output is live while every tile decodes.
  int64_t output_bytes = 4;
  for (int64_t d : decoder.OutputShape(z.sizes().vec())) output_bytes *= d;
  const int64_t budget =
      free >= 0 ? std::max<int64_t>(0, free - output_bytes) : std::numeric_limits<int64_t>::max() / 2;
  const tiling::TilePlan plan = tiling::PlanTiles(z.size(-2), z.size(-1), geometry, budget);
  families::DenseOps ops;
  const int64_t before = memory.current_bytes();
  memory.ResetPeak();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<tiling::TiledResult> tiled =
      tiling::RunOomLadder(plan, geometry, [&](const tiling::TilePlan& p) -> absl::StatusOr<at::Tensor> {
        at::Tensor sample;
        absl::Status s = worker::CatchExceptions("tiled decode", [&] { sample = tiling::DecodeTiles(decoder, z, p, ops); });
        if (!s.ok()) return s;
        return sample;
      });
  if (!tiled.ok() && tiled.status().code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(absl::StrCat(
        tiled.status().message(), " (plan: ", plan.reason, "; the budget is ", Mib(budget), " MiB and the ",
        tiling::kFloorTile, "-latent floor tile needs about ",
        Mib(tiling::EstimatePeakBytes(geometry, std::min<int64_t>(tiling::kFloorTile, z.size(-2)),
                                      std::min<int64_t>(tiling::kFloorTile, z.size(-1)))),
        " MiB)"));
  }
  if (!tiled.ok()) return tiled.status();
  device::SynchronizeDevice(decoder.device());
  const double ms = MillisecondsSince(start);
  const std::string plan_text = tiled->plan.kind == tiling::PlanKind::kUntiled
                                    ? "untiled"
                                    : absl::StrCat(tiled->plan.rows.starts.size(), "x", tiled->plan.cols.starts.size(),
                                                   "_tiles_of_", tiled->plan.rows.tile, "x", tiled->plan.cols.tile);
  return DecodeOutcome{
      tiled->sample, "tiled (" + tiled->plan.reason + ")", ms,
      absl::StrCat(" plan=", plan_text, " tile_calls=", tiled->plan.calls(), " tile_retries=", tiled->retries,
                   " decoded_latents=", tiled->plan.rows.decoded() * tiled->plan.cols.decoded(),
                   " stock_decoded_latents=",
                   tiling::StockDecodedLatents(z.size(-2), geometry) * tiling::StockDecodedLatents(z.size(-1), geometry),
                   " budget_mib=", free >= 0 ? Mib(free) : "unbounded",
                   // The calibrated estimate of one tile's peak, and with the planner's headroom.
                   " predicted_peak_mib=",
                   Mib(tiling::PredictPeakBytes(geometry, tiled->plan.rows.tile, tiled->plan.cols.tile)),
                   " planned_peak_mib=", Mib(static_cast<double>(tiled->plan.peak_bytes)),
                   " decode_peak_mib=", Mib(memory.peak_bytes() - before), " peak_mib=[", Mib(memory.peak_bytes()), "]")};
}

}  // namespace

const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"decode",
       {"model", "latent", "out", "latent-space", "dtype", "threads", "latent-shape", "seed", "mode",
        "ranks", "timeout-s", "device", "budget-mib", "seeded-weights", "warmup", "repeat"}},
      {"info", {"model"}},
      // Internal: a peer rank of `decode --mode exact`, started by the leader.
      {"rank", {"rank", "world", "store-port", "group", "model", "dtype", "threads", "timeout-s"}},
  };
  return *flags;
}

std::string Usage() {
  return "usage:\n"
         "  vaedecode decode [--model DIR] [--latent FILE] --out FILE [--latent-space vae|raw]\n"
         "                   [--dtype float32|bfloat16|float16] [--threads N]\n"
         "                   [--device cpu|cuda:N] [--mode dense|tiled|exact] [--budget-mib M]\n"
         "                   [--ranks N --timeout-s S]   (exact: N local CPU ranks)\n"
         "                   [--latent-shape 1,4,32,32 --seed N]   (demo latent when --latent is absent)\n"
         "                   [--seeded-weights SEED]   (--model's config.json alone, weights seeded)\n"
         "                   [--warmup W --repeat N]   (dense/tiled: W untimed decodes, then N timed)\n"
         "  vaedecode info [--model DIR]\n"
         "Without --model, an embedded SD-1.x-shaped AutoencoderKL with seeded random weights is used.\n"
         "--latent: .safetensors (one tensor, or the tensor named \"latent\") or .npy.\n"
         "--out: .safetensors / .npy (float32 tensor \"sample\") or .png (one image per batch entry).\n"
         "--budget-mib: memory the decode may use on the device beyond the loaded model; --mode tiled sizes\n"
         "  its tiles from the model's measured peak to fit it (allocations beyond it fail and retry smaller).\n"
         "--repeat N: decode_ms is the median of the N timed decodes (decode_ms_runs lists them).\n";
}

absl::Status RunDecode(const ParsedArgs& args, std::ostream& out) {
  std::optional<std::string> out_path = args.Get("out");
  if (!out_path) return absl::InvalidArgumentError("decode needs --out FILE (.safetensors, .npy or .png)");
  const std::string out_file = ResolveUserPath(*out_path);
  if (!EndsWith(out_file, ".safetensors") && !EndsWith(out_file, ".npy") && !EndsWith(out_file, ".png")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", *out_path, ": extension must be .safetensors, .npy or .png"));
  }
  families::LatentSpace space = families::LatentSpace::kVae;
  const std::string space_name = args.Get("latent-space").value_or("vae");
  if (space_name == "raw") {
    space = families::LatentSpace::kRaw;
  } else if (space_name != "vae") {
    return absl::InvalidArgumentError(absl::StrCat("--latent-space must be vae or raw, got \"", space_name, "\""));
  }
  absl::StatusOr<at::ScalarType> dtype = families::ParseDtype(args.Get("dtype").value_or("float32"));
  if (!dtype.ok()) return dtype.status();
  if (absl::Status s = ApplyThreads(args); !s.ok()) return s;

  const std::string mode = args.Get("mode").value_or("dense");
  int ranks = 1;
  if (mode != "dense" && mode != "exact" && mode != "tiled") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be dense, tiled or exact, got \"", mode, "\""));
  }
  if (auto r = args.Get("ranks"); r && (!absl::SimpleAtoi(*r, &ranks) || ranks < 1 || ranks > 64)) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks must be an integer in 1..64, got \"", *r, "\""));
  }
  if (mode != "exact" && ranks != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks needs --mode exact (", mode, " decodes in one process)"));
  }
  int timeout_s = 120;
  if (auto t = args.Get("timeout-s"); t && (!absl::SimpleAtoi(*t, &timeout_s) || timeout_s < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout-s must be a positive integer, got \"", *t, "\""));
  }

  int64_t budget_mib = 0;
  if (auto b = args.Get("budget-mib");
      b && (!absl::SimpleAtoi(*b, &budget_mib) || budget_mib < 1 || budget_mib > (int64_t{1} << 30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--budget-mib must be a positive integer (at most 2^30), got \"", *b, "\""));
  }
  int warmup = 0, repeat = 1;
  if (auto w = args.Get("warmup"); w && (!absl::SimpleAtoi(*w, &warmup) || warmup < 0 || warmup > 1000)) {
    return absl::InvalidArgumentError(absl::StrCat("--warmup must be an integer in 0..1000, got \"", *w, "\""));
  }
  if (auto r = args.Get("repeat"); r && (!absl::SimpleAtoi(*r, &repeat) || repeat < 1 || repeat > 1000)) {
    return absl::InvalidArgumentError(absl::StrCat("--repeat must be an integer in 1..1000, got \"", *r, "\""));
  }
  std::optional<uint64_t> seeded_weights;
  if (auto s = args.Get("seeded-weights")) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(*s, &seed)) {
      return absl::InvalidArgumentError(absl::StrCat("--seeded-weights must be an integer seed, got \"", *s, "\""));
    }
    if (!args.Get("model")) return absl::InvalidArgumentError("--seeded-weights needs --model DIR (its config.json)");
    seeded_weights = seed;
  }
  if (mode == "exact" && (warmup > 0 || repeat > 1 || seeded_weights)) {
    return absl::InvalidArgumentError("--warmup, --repeat and --seeded-weights are for dense and tiled decodes");
  }
  absl::StatusOr<c10::Device> device = device::ParseComputeDevice(args.Get("device").value_or("cpu"));
  if (!device.ok()) return device.status();
  if (mode == "exact" && (!device->is_cpu() || budget_mib > 0)) {
    return absl::InvalidArgumentError(
        "--mode exact runs local CPU ranks without a budget; GPU groups and budgets are vaedecode_server's");
  }
  if (absl::Status s = device::PrepareComputeDevice(*device); !s.ok()) return s;
  absl::StatusOr<device::DeviceMemory*> memory = device::InstallDeviceMemory(*device);
  if (!memory.ok()) return memory.status();

  absl::StatusOr<LoadedModel> model = LoadModel(args.Get("model"), *dtype, seeded_weights);
  if (!model.ok()) return model.status();
  if (!device->is_cpu()) {
    absl::Status moved = worker::CatchExceptions("moving the weights", [&] { model->decoder->ToDevice(*device); });
    if (!moved.ok()) return moved;
  }

  at::Tensor latent;
  std::string latent_name;
  if (auto latent_path = args.Get("latent")) {
    absl::StatusOr<at::Tensor> read = formats::ReadTensorFile(ResolveUserPath(*latent_path), "latent");
    if (!read.ok()) return read.status();
    latent = *read;
    latent_name = *latent_path;
  } else {
    absl::StatusOr<std::vector<int64_t>> shape = ParseShape(args.Get("latent-shape").value_or(kDemoLatentShape));
    if (!shape.ok()) return shape.status();
    uint64_t seed = kDemoLatentSeed;
    if (auto s = args.Get("seed"); s && !absl::SimpleAtoi(*s, &seed)) {
      return absl::InvalidArgumentError(absl::StrCat("--seed must be an integer, got \"", *s, "\""));
    }
    latent = DemoLatent(*shape, seed);
    latent_name = absl::StrCat("demo(seed=", seed, ")");
  }

  const worker::DecodeJob job{latent, space};
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<at::Tensor> sample;
  std::string mode_used = "dense";
  std::string figures;
  if (mode == "exact") {
    GroupLaunch launch;
    launch.ranks = ranks;
    launch.model_path = args.Get("model").value_or("");
    launch.dtype_name = families::DtypeName(*dtype);
    launch.threads = at::get_num_threads();
    launch.timeout = absl::Seconds(timeout_s);
    absl::StatusOr<LocalGroupResult> result = DecodeWithLocalGroup(launch, *model->decoder, job);
    if (!result.ok()) return result.status();
    mode_used = result->decode.mode;
    if (!result->decode.reason.empty()) mode_used += " (" + result->decode.reason + ")";
    sample = result->decode.sample;
    std::vector<std::string> peaks, times;
    for (const worker::RankStats& r : result->ranks) {
      peaks.push_back(Mib(r.peak_bytes));
      times.push_back(absl::StrFormat("%.0f", r.decode_ms));
    }
    figures = absl::StrCat(" decode_ms=", absl::StrFormat("%.0f", result->decode.decode_ms), " rank_decode_ms=[",
                           absl::StrJoin(times, ","), "] peak_mib=[", absl::StrJoin(peaks, ","),
                           "] collectives=", result->comm.collectives(), " comm={", result->comm.ToString(), "}");
  } else {
    // Budgets count beyond the loaded model (it is not the decode's).
    const int64_t budget = budget_mib << 20;
    std::vector<double> runs;
    absl::StatusOr<DecodeOutcome> outcome;
    for (int i = 0; i < warmup + repeat; ++i) {
      outcome = mode == "tiled" ? DecodeTiled(*model->decoder, job, **memory, budget)
                                : DecodeDense(*model->decoder, job, **memory, budget);
      (void)(*memory)->SetBudget(0);  // writing the output is not the decode's
      if (!outcome.ok()) return outcome.status();
      if (i >= warmup) runs.push_back(outcome->decode_ms);
    }
    sample = outcome->sample;
    mode_used = outcome->mode;
    std::vector<double> sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    figures = absl::StrCat(" decode_ms=", absl::StrFormat("%.1f", median));
    if (n > 1) {
      std::vector<std::string> texts;
      for (double ms : runs) texts.push_back(absl::StrFormat("%.1f", ms));
      absl::StrAppend(&figures, " decode_ms_runs=[", absl::StrJoin(texts, ","), "] warmup=", warmup);
    }
    absl::StrAppend(&figures, outcome->figures);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!sample.ok()) return sample.status();

  at::Tensor result = sample->to(at::kFloat).cpu().contiguous();
  std::string written = out_file;
  if (EndsWith(out_file, ".png")) {
    absl::StatusOr<std::vector<std::string>> files = formats::WritePngImages(out_file, result);
    if (!files.ok()) return files.status();
    written = absl::StrJoin(*files, ",");
  } else if (absl::Status s = formats::WriteTensorFile(out_file, "sample", result); !s.ok()) {
    return s;
  }
  out << "decoded model=" << model->name << " family=" << model->decoder->info().family
      << " latent=" << latent_name << " latent_shape=" << ShapeText(latent.sizes())
      << " space=" << space_name << " sample_shape=" << ShapeText(result.sizes())
      << " dtype=" << families::DtypeName(model->decoder->dtype())
      << (model->decoder->dtype() != *dtype ? " requested_dtype=" + families::DtypeName(*dtype) + " (force_upcast)" : "")
      << " device=" << device->str() << " mode=" << mode_used << " ranks=" << ranks << " threads=" << at::get_num_threads()
      << " time_ms=" << static_cast<int64_t>(ms) << figures << " max_rss_mib=" << MaxRssMib()
      << " out=" << written << "\n";
  return absl::OkStatus();
}

absl::Status RunInfo(const ParsedArgs& args, std::ostream& out) {
  absl::StatusOr<LoadedModel> model = LoadModel(args.Get("model"), at::kFloat);
  if (!model.ok()) return model.status();
  const families::ModelInfo& m = model->decoder->info();
  out << "model: " << model->name << "\n"
      << "family: " << m.family << " (diffusers " << m.diffusers_class << ")\n"
      << "parameters: " << m.parameter_count << "\n"
      << "latent channels: " << m.latent_channels << "\n"
      << "output channels: " << m.out_channels << "\n"
      << "spatial factor: " << m.spatial_factor << "\n";
  if (m.is_video) out << "temporal factor: " << m.temporal_factor << "\n";
  out << "scaling factor: " << m.scaling_factor << "\n"
      << "shift factor: " << (m.shift_factor ? absl::StrCat(*m.shift_factor) : "none") << "\n"
      << "raw latent space: " << m.raw_to_vae_formula << "\n"
      << "libtorch: " << worker::LibTorchSummary() << "\n"
      << "config: " << m.config_json << "\n";
  return absl::OkStatus();
}

}  // namespace vaedecode::cli
