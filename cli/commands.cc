#include "cli/commands.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/group_mode.h"
#include "cli/model_loading.h"
#include "client/client_io.h"
#include "device/compute_device.h"
#include "device/device_memory.h"
#include "families/builtin_families.h"
#include "formats/image_input.h"
#include "formats/tensor_file.h"
#include "rpc/leader_call.h"
#include "rpc/modes.h"
#include "rpc/output_assembler.h"
#include "rpc/output_formats.h"
#include "rpc/request_checks.h"
#include "rpc/request_options.h"
#include "rpc/session_stream.h"
#include "rpc/status_macros.h"
#include "tiling/calibration.h"
#include "tiling/planner.h"
#include "worker/decode_job.h"
#include "worker/decode_plan.h"
#include "worker/encode_job.h"
#include "worker/group_decode.h"
#include "worker/group_encode.h"
#include "worker/group_runtime.h"
#include "worker/leader_response.h"
#include "worker/output_stream.h"
#include "worker/proto_conversion.h"
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
    data[i] = static_cast<float>(std::sqrt(-2.0 * std::log(next_unit())) * std::cos(6.283185307179586 * next_unit()));
  }
  return t;
}

std::string ShapeText(c10::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ","), "]"); }

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

// --NAME as an integer in [lo, hi]; `fallback` when absent.
absl::StatusOr<int> IntFlagInRange(const ParsedArgs& args, const std::string& name, int fallback, int lo, int hi) {
  std::optional<std::string> text = args.Get(name);
  if (!text) return fallback;
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer in ", lo, "..", hi, ", got \"", *text, "\""));
  }
  return value;
}

// --seeded-weights SEED: --model's config.json alone, its weights seeded.
absl::StatusOr<std::optional<uint64_t>> SeededWeightsFlag(const ParsedArgs& args) {
  std::optional<std::string> text = args.Get("seeded-weights");
  if (!text) return std::optional<uint64_t>();
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(*text, &seed)) {
    return absl::InvalidArgumentError(absl::StrCat("--seeded-weights must be an integer seed, got \"", *text, "\""));
  }
  if (!args.Get("model")) return absl::InvalidArgumentError("--seeded-weights needs --model DIR (its config.json)");
  return std::optional<uint64_t>(seed);
}

// What the decodes of one CLI run measured, for the summary line.
struct RunFigures {
  std::vector<double> decode_ms;  // the timed runs', in order
  int64_t before_bytes = 0;       // live on the leader's device before the last decode
  int64_t budget_bytes = -1;      // the leader's free bytes the last plan saw; -1: unbounded
};

std::string MibList(const std::vector<worker::RankStats>& ranks) {
  std::vector<std::string> out;
  for (const worker::RankStats& r : ranks) out.push_back(Mib(static_cast<double>(r.peak_bytes)));
  return absl::StrJoin(out, ",");
}

// The summary line's figures, the same for every mode: the timing, the
// plan, the memory and the group's collectives.
std::string Figures(const families::Decoder& decoder, const worker::DecodePlan& plan,
                    const worker::DecodeOutcome& outcome, const tiling::PeakProfile* profile, const RunFigures& run,
                    int warmup) {
  std::vector<double> sorted = run.decode_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  std::string figures = absl::StrCat(" decode_ms=", absl::StrFormat("%.1f", median));
  if (n > 1) {
    std::vector<std::string> texts;
    for (double ms : run.decode_ms) texts.push_back(absl::StrFormat("%.1f", ms));
    absl::StrAppend(&figures, " decode_ms_runs=[", absl::StrJoin(texts, ","), "] warmup=", warmup);
  }
  const worker::GroupDecodeResult& result = outcome.result;
  if (result.mode == worker::DecodeMode::kTiled) {
    const tiling::TilePlan& tiles = result.tiles;
    const tiling::FamilyGeometry geometry =
        profile != nullptr
            ? tiling::PlanningGeometry(decoder, *profile,
                                       {plan.latent.size(0), decoder.info().is_video ? plan.latent.size(2) : 1,
                                        plan.latent.size(-2), plan.latent.size(-1)})
            : tiling::DecoderGeometry(decoder);
    const std::string plan_text = tiles.calls() == 1
                                      ? "untiled"
                                      : absl::StrCat(tiles.rows.starts.size(), "x", tiles.cols.starts.size(),
                                                     "_tiles_of_", tiles.rows.tile, "x", tiles.cols.tile);
    absl::StrAppend(&figures, " plan=", plan_text, " tile_calls=", tiles.calls(), " tile_retries=", result.tile_retries,
                    " decoded_latents=", tiles.rows.decoded() * tiles.cols.decoded(), " stock_decoded_latents=",
                    tiling::StockDecodedLatents(tiles.rows.length, geometry) *
                        tiling::StockDecodedLatents(tiles.cols.length, geometry),
                    " budget_mib=", run.budget_bytes >= 0 ? Mib(static_cast<double>(run.budget_bytes)) : "unbounded",
                    // The calibrated estimate of one tile's peak, and with the planner's headroom.
                    " predicted_peak_mib=", Mib(tiling::PredictPeakBytes(geometry, tiles.rows.tile, tiles.cols.tile)),
                    " planned_peak_mib=", Mib(tiling::EstimatePeakBytes(geometry, tiles.rows.tile, tiles.cols.tile)));
  }
  std::vector<std::string> times, comm_times;
  for (const worker::RankStats& r : outcome.ranks) {
    times.push_back(absl::StrFormat("%.0f", r.decode_ms));
    comm_times.push_back(absl::StrFormat("%.0f", r.comm_ms));
  }
  const int64_t leader_peak = outcome.ranks.empty() ? 0 : outcome.ranks[0].peak_bytes;
  absl::StrAppend(&figures, " decode_peak_mib=", Mib(static_cast<double>(leader_peak - run.before_bytes)),
                  " peak_mib=[", MibList(outcome.ranks), "] rank_decode_ms=[", absl::StrJoin(times, ","),
                  "] rank_comm_ms=[", absl::StrJoin(comm_times, ","), "] collectives=", outcome.comm.collectives(),
                  " comm={", outcome.comm.ToString(), "}");
  return figures;
}

// The request options the CLI offers (rpc/request_options.h: --latent-space,
// --jpeg-quality, --fps, --scaling-factor, ...; --posterior, --seed for an
// encode) into `request`, parsed and range-checked by the table, as every
// front end does.
template <typename Request>
absl::Status ParseRequestOptions(const ParsedArgs& args, absl::Span<const rpc::OptionInfo> options, Request& request) {
  for (const rpc::OptionInfo& option : options) {
    if ((option.surfaces & rpc::kCli) == 0) continue;
    const std::string flag = option.CliFlag();
    std::optional<std::string> value = args.Get(flag.substr(2));
    if (!value) continue;
    if (absl::Status s = rpc::SetOption(option, *value, request); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, s.message().substr(option.name.size())));
    }
  }
  return absl::OkStatus();
}

// Collects the leader's response stream as a client would.
class AssemblingSink final : public worker::ResponseSink {
 public:
  explicit AssemblingSink(rpc::OutputAssembler& output) : output_(output) {}
  bool Write(const v1::DecodeResponse& message) override {
    status_.Update(output_.Add(message));
    return status_.ok();
  }
  bool cancelled() const override { return false; }
  const absl::Status& status() const { return status_; }

 private:
  rpc::OutputAssembler& output_;
  absl::Status status_;
};

// --stream-chunks 1,2,2: latent frames per chunk, which must add up to the
// latent's; empty without the flag.
absl::StatusOr<std::vector<int64_t>> StreamChunksFlag(const ParsedArgs& args, const at::Tensor& latent,
                                                      const families::Decoder& decoder) {
  std::optional<std::string> text = args.Get("stream-chunks");
  if (!text) return std::vector<int64_t>();
  RETURN_IF_ERROR(decoder.CheckStreaming());
  return rpc::ParseStreamChunks("--stream-chunks", *text, latent.dim() == 5 ? latent.size(2) : 1);
}

// The latent decoded through one streaming session, `chunks` latent frames
// at a time, each chunk a job on the group as the service runs a session's
// (planned alone, decoded through the session's state on the ranks); one
// line per chunk to `out`. The outcome: the chunks' frames concatenated,
// their decode times and collectives summed, the last chunk's rank figures.
absl::StatusOr<worker::DecodeOutcome> DecodeInChunks(worker::GroupRuntime& runtime, families::Decoder& decoder,
                                                     const v1::DecodeRequest& request, const at::Tensor& latent,
                                                     const worker::PlanningContext& planning,
                                                     const std::vector<int64_t>& chunks, bool overlap_halo,
                                                     std::ostream& out) {
  constexpr int64_t kSessionId = 1;
  worker::DecodeOutcome whole;
  std::vector<at::Tensor> frames;
  int64_t begin = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    worker::DecodeJob job = worker::JobFromRequest(request, latent.narrow(2, begin, chunks[i]));
    job.session_chunk = true;
    worker::GroupJob group_job;
    ASSIGN_OR_RETURN(group_job.plan, worker::PlanDecode(decoder, job, planning));
    group_job.plan.overlap_halo = overlap_halo;
    group_job.plan.session = {kSessionId, /*start=*/i == 0, /*ends=*/i + 1 == chunks.size(), 0};
    ASSIGN_OR_RETURN(worker::DecodeOutcome chunk, runtime.Run(group_job));
    frames.push_back(chunk.result.sample);
    out << "chunk=" << i << " latent_frames=" << chunks[i] << " frames=" << chunk.result.sample.size(2)
        << " mode=" << worker::ModeName(chunk.result.mode)
        << " decode_ms=" << absl::StrFormat("%.1f", chunk.result.decode_ms)
        << " collectives=" << chunk.comm.collectives() << " state_mib=["
        << absl::StrJoin(chunk.ranks, ",",
                         [](std::string* s, const worker::RankStats& r) {
                           absl::StrAppend(s, Mib(static_cast<double>(r.session_state_bytes)));
                         })
        << "]\n";
    const double decode_ms = whole.result.decode_ms + chunk.result.decode_ms;
    const parallel::CommStats comm = whole.comm;
    whole = std::move(chunk);
    whole.result.decode_ms = decode_ms;
    whole.comm += comm;
    begin += chunks[i];
  }
  RETURN_IF_ERROR(runtime.CloseSession(kSessionId));
  whole.result.sample = at::cat(frames, 2);
  return whole;
}

}  // namespace

const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const auto* flags = [] {
    auto* f = new std::map<std::string, std::set<std::string>>{
        {"decode",
         {"model",  "latent",       "out",           "dtype",        "threads",      "latent-shape",   "seed",
          "mode",   "ranks",        "timeout-s",     "device",       "budget-mib",   "seeded-weights", "warmup",
          "repeat", "halo-overlap", "stream-chunks", "wav-encoding", "audio-latent", "audio-model"}},
        {"encode",
         {"model", "image", "out", "mode", "ranks", "dtype", "threads", "timeout-s", "seeded-weights", "warmup",
          "repeat"}},
        {"info", {"model"}},
        // Internal: a peer rank of `decode --mode exact`, started by the leader.
        {"rank", {"rank", "world", "store-port", "group", "model", "dtype", "threads", "timeout-s", "seeded-weights"}},
    };
    for (const rpc::OptionInfo& option : rpc::RequestOptions()) {
      if ((option.surfaces & rpc::kCli) != 0) (*f)["decode"].insert(option.CliFlag().substr(2));
    }
    for (const rpc::OptionInfo& option : rpc::EncodeOptions()) {
      if ((option.surfaces & rpc::kCli) != 0) (*f)["encode"].insert(option.CliFlag().substr(2));
    }
    return f;
  }();
  return *flags;
}

std::string Usage() {
  return "usage:\n"
         "  vaedecode decode [--model DIR] [--latent FILE] --out FILE [request options below]\n"
         "                   [--dtype float32|bfloat16|float16] [--threads N]\n"
         "                   [--device cpu|cuda:N] [--mode dense|tiled|exact] [--budget-mib M]\n"
         "                   [--ranks N --timeout-s S]   (exact: N local CPU ranks)\n"
         "                   [--latent-shape 1,4,32,32 --seed N]   (demo latent when --latent is absent)\n"
         "                   [--seeded-weights SEED]   (--model's config.json alone, weights seeded)\n"
         "                   [--warmup W --repeat N]   (dense/tiled: W untimed decodes, then N timed)\n"
         "                   [--stream-chunks 1,2,2]   (video: a streaming session, that many latent frames\n"
         "                   per chunk; dense or exact)\n"
         "                   [--audio-latent FILE [--audio-model DIR] [--audio-latent-space vae|raw]]\n"
         "                   (.mp4: the audio VAE's waveform muxed as an AAC track; DIR defaults to the\n"
         "                   audio_vae/ folder beside --model's, as LTX-2's repository has it)\n"
         "  vaedecode decode --model AUDIO_VAE_DIR --latent FILE --out FILE.wav|.safetensors|.npy\n"
         "                   [--latent-space vae|raw] [--wav-encoding pcm16|float32]   (an audio VAE's\n"
         "                   latent [B, C, L], or LTX-2's [B, C, L, M], to its waveform; a WAV per batch\n"
         "                   entry; --audio-output mel: LTX-2's mel spectrogram, to a tensor file)\n"
         "  vaedecode encode --model DIR --image FILE --out FILE.safetensors [--posterior mean|sample|moments]\n"
         "                   [--seed N] [--latent-space vae|raw] [--mode dense|exact] [--ranks N]\n"
         "                   [--dtype float32|bfloat16|float16] [--threads N] [--timeout-s S]\n"
         "                   [--seeded-weights SEED] [--warmup W --repeat N]\n"
         "  vaedecode info [--model DIR]\n"
         "Without --model, an embedded SD-1.x-shaped AutoencoderKL with seeded random weights is used.\n"
         "--latent: .safetensors (one tensor, or the tensor named \"latent\") or .npy.\n"
         "--out: .safetensors / .npy (float32 tensor \"sample\"), .png / .jpg (one image per batch entry and\n"
         "  frame) or .mp4 (one video per batch entry), written as vaedecode_client writes the service's output.\n"
         "--budget-mib: memory the decode may use on the device beyond the loaded model; --mode tiled sizes\n"
         "  its tiles from the model's measured peak to fit it (allocations beyond it fail and retry smaller).\n"
         "--repeat N: decode_ms is the median of the N timed decodes (decode_ms_runs lists them).\n"
         "--stream-chunks: decodes the latent as the service's DecodeSession does, chunk by chunk with the\n"
         "  decoder's causal state carried between chunks (the last chunk ends the clip), and prints each\n"
         "  chunk's decode time and frames (a windowed decoder's chunk may have none); the output equals the\n"
         "  decode without it.\n"
         "--halo-overlap on|off: exact convolutions compute while their halo rows travel (on, the default) or\n"
         "  wait for them first (off: for measuring the overlap; the output is exact either way).\n"
         "encode: --image is .png / .jpg (preprocessed as diffusers does: p / 255 * 2 - 1), .mp4 (every frame,\n"
         "  for video models) or .safetensors / .npy (one tensor [B, C, H, W] or [B, C, T, H, W], the encoder's\n"
         "  input, values in [-1, 1]); --out holds \"latent\" (the posterior's mean, or a\n"
         "  sample drawn as torch.Generator().manual_seed(--seed) draws it), or \"mean\" and \"logvar\" for\n"
         "  --posterior moments; --latent-space raw normalises it as the family's pipeline feeds its denoiser.\n"
         "request options (the service's, checked as it checks them):\n" +
         rpc::OptionUsage(rpc::kCli) + "encode options (the service's, the same way):\n" +
         rpc::EncodeOptionUsage(rpc::kCli);
}

// `decode` of an audio VAE's latent [B, C, L]: densely on this process
// (audio latents are small; no plan, group or image output), written as a
// WAV file (.wav: 16-bit PCM, or float32 with --wav-encoding float32; a
// batch entry's channels in one file, a file per entry, `stem_<i>.wav`) or
// the float32 waveform [B, channels, samples] ("sample", with the sample
// rate in the line printed). An audio VAE with a vocoder (LTX-2) writes its
// mel spectrogram [B, C, frames, bins] instead with --audio-output mel (or
// always, when the folder has no vocoder): tensor files only.
absl::Status RunAudioDecode(const ParsedArgs& args, std::ostream& out) {
  std::optional<std::string> out_path = args.Get("out");
  if (!out_path) return absl::InvalidArgumentError("decode needs --out FILE (.wav, .safetensors or .npy for audio)");
  const std::string out_file = ResolveUserPath(*out_path);
  const bool wav = absl::EndsWith(out_file, ".wav");
  if (!wav && !absl::EndsWith(out_file, ".safetensors") && !absl::EndsWith(out_file, ".npy")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", *out_path, ": an audio VAE decodes to .wav, .safetensors or .npy"));
  }
  const std::string encoding = args.Get("wav-encoding").value_or("pcm16");
  if (encoding != "pcm16" && encoding != "float32") {
    return absl::InvalidArgumentError(absl::StrCat("--wav-encoding must be pcm16 or float32, got \"", encoding, "\""));
  }
  // The request options (--latent-space, --scaling-factor, ...) as the service reads them.
  v1::DecodeRequest request;
  RETURN_IF_ERROR(ParseRequestOptions(args, rpc::RequestOptions(), request));
  const std::string space = request.latent_space() == v1::LATENT_SPACE_RAW ? "raw" : "vae";
  if (args.Get("mode").value_or("dense") != "dense") {
    return absl::InvalidArgumentError("an audio VAE decodes dense (its latents are small): drop --mode");
  }
  RETURN_IF_ERROR(ApplyThreads(args));
  ASSIGN_OR_RETURN(const std::optional<uint64_t> seeded_weights, SeededWeightsFlag(args));
  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(args.Get("model"), at::kFloat, seeded_weights));
  std::optional<std::string> latent_path = args.Get("latent");
  if (!latent_path) return absl::InvalidArgumentError("decode of an audio VAE needs --latent FILE ([B, C, L])");
  ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(ResolveUserPath(*latent_path), "latent"));
  const auto start = std::chrono::steady_clock::now();
  families::DenseOps ops;
  ASSIGN_OR_RETURN(at::Tensor sample, worker::RunDecode(*model.decoder, worker::JobFromRequest(request, latent), ops));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  sample = sample.to(at::kFloat).contiguous();  // [B, channels, samples], or a mel spectrogram [B, C, frames, bins]
  const families::ModelInfo& info = model.decoder->info();
  const bool mel = sample.dim() == 4;
  if (mel && wav) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", *out_path, ": ", model.name, " decoded a mel spectrogram ",
                     info.sample_rate == 0 ? "(its folder has no vocoder)" : "(--audio-output mel)",
                     ", not a waveform: write it to .safetensors or .npy"));
  }
  // Streamed as the service streams it (a tensor, or a WAV per batch
  // entry) and written as its client writes it.
  request.set_output_format(!wav                    ? v1::OUTPUT_FLOAT32
                            : encoding == "float32" ? v1::OUTPUT_WAV_FLOAT32
                                                    : v1::OUTPUT_WAV);
  rpc::OutputAssembler assembled;
  v1::DecodeResponse header;
  RETURN_IF_ERROR(worker::DescribeOutput(sample, request.output_format(), header.mutable_header()));
  if (!mel) header.mutable_header()->set_sample_rate(info.sample_rate);
  RETURN_IF_ERROR(assembled.Add(header));
  absl::Status added;
  RETURN_IF_ERROR(worker::EmitChunks(sample, worker::EncodingOf(request, {}, info.sample_rate),
                                     rpc::kDefaultMaxChunkBytes, [&](v1::Chunk&& chunk) {
                                       v1::DecodeResponse message;
                                       *message.mutable_chunk() = std::move(chunk);
                                       added = assembled.Add(message);
                                       return added.ok();
                                     }));
  RETURN_IF_ERROR(added);
  v1::DecodeResponse trailer;
  trailer.mutable_trailer();
  RETURN_IF_ERROR(assembled.Add(trailer));
  ASSIGN_OR_RETURN(const std::vector<std::string> written, client::WriteOutput(out_file, assembled));
  out << "decoded model=" << model.name << " family=" << info.family << " latent=" << *latent_path
      << " latent_shape=" << ShapeText(latent.sizes()) << " space=" << space
      << " sample_shape=" << ShapeText(sample.sizes()) << " output=" << (mel ? "mel" : "waveform")
      << " sample_rate=" << info.sample_rate;
  if (!mel) out << " seconds=" << static_cast<double>(sample.size(2)) / info.sample_rate;
  out << " dtype=float32 device=cpu mode=dense ranks=1 threads=" << at::get_num_threads()
      << " time_ms=" << static_cast<int64_t>(ms) << " out=" << absl::StrJoin(written, ",") << "\n";
  return absl::OkStatus();
}

// decode --audio-latent: the audio VAE's waveform for an .mp4's audio track
// and its rate, as the service's leader decodes it (dense, float32).
absl::StatusOr<std::pair<at::Tensor, int64_t>> DecodeMuxedAudio(const ParsedArgs& args,
                                                                const v1::DecodeRequest& video_request, int64_t clips) {
  if (video_request.output_format() != v1::OUTPUT_MP4) {
    return absl::InvalidArgumentError("--audio-latent is muxed into a video: --out must be .mp4");
  }
  std::string model_path;
  if (std::optional<std::string> given = args.Get("audio-model")) {
    model_path = ResolveUserPath(*given);
  } else if (std::optional<std::string> video = args.Get("model")) {
    std::string folder = ResolveUserPath(*video);
    while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
    model_path = (std::filesystem::path(folder).parent_path() / "audio_vae").string();
  } else {
    return absl::InvalidArgumentError("--audio-latent needs --audio-model DIR (the embedded model has no audio)");
  }
  ASSIGN_OR_RETURN(const bool audio, families::BuiltinFamilies().DecodesAudio(model_path));
  if (!audio) return absl::InvalidArgumentError(absl::StrCat("--audio-model ", model_path, " is not an audio VAE"));
  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(model_path, at::kFloat, std::nullopt));
  const families::ModelInfo& info = model.decoder->info();
  if (info.sample_rate == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--audio-model ", model_path, " has no vocoder: it decodes to a mel spectrogram, not audio"));
  }
  const v1::DecodeRequest request = rpc::MuxedAudioRequest(video_request);  // its --audio-latent-space
  ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(ResolveUserPath(*args.Get("audio-latent")), "latent"));
  families::DenseOps ops;
  ASSIGN_OR_RETURN(at::Tensor waveform,
                   worker::RunDecode(*model.decoder, worker::JobFromRequest(request, latent), ops));
  ASSIGN_OR_RETURN(at::Tensor track, worker::MuxableAudio(waveform, clips));
  return std::make_pair(track, info.sample_rate);
}

absl::Status RunDecode(const ParsedArgs& args, std::ostream& out) {
  // An audio VAE has its own, short path.
  if (std::optional<std::string> model_path = args.Get("model"); model_path && !model_path->empty()) {
    ASSIGN_OR_RETURN(const bool audio, families::BuiltinFamilies().DecodesAudio(ResolveUserPath(*model_path)));
    if (audio) return RunAudioDecode(args, out);
  }
  std::optional<std::string> out_path = args.Get("out");
  if (!out_path) return absl::InvalidArgumentError("decode needs --out FILE (.safetensors, .npy, .png, .jpg or .mp4)");
  const std::string out_file = ResolveUserPath(*out_path);
  // The request a client would send for this decode (its latent comes from
  // --latent): the service's options, checked and converted as it does.
  v1::DecodeRequest request;
  ASSIGN_OR_RETURN(const v1::OutputFormat format, rpc::FormatForExtension(out_file));
  request.set_output_format(format);
  RETURN_IF_ERROR(ParseRequestOptions(args, rpc::RequestOptions(), request));
  const std::string space_name = request.latent_space() == v1::LATENT_SPACE_RAW ? "raw" : "vae";
  ASSIGN_OR_RETURN(at::ScalarType dtype, families::ParseDtype(args.Get("dtype").value_or("float32")));
  RETURN_IF_ERROR(ApplyThreads(args));

  const std::string mode_flag = args.Get("mode").value_or("dense");
  absl::StatusOr<v1::Mode> parsed_mode = rpc::ParseMode(mode_flag);
  if (!parsed_mode.ok() || *parsed_mode == v1::MODE_AUTO) {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be dense, tiled or exact, got \"", mode_flag, "\""));
  }
  const std::string mode = rpc::ModeName(*parsed_mode);
  ASSIGN_OR_RETURN(const int ranks, IntFlagInRange(args, "ranks", 1, 1, 64));
  if (mode != "exact" && ranks != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks needs --mode exact (", mode, " decodes in one process)"));
  }
  const std::string halo_overlap = args.Get("halo-overlap").value_or("on");
  if (halo_overlap != "on" && halo_overlap != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--halo-overlap must be on or off, got \"", halo_overlap, "\""));
  }
  ASSIGN_OR_RETURN(const int timeout_s, IntFlagInRange(args, "timeout-s", 120, 1, 86400));

  int64_t budget_mib = 0;
  if (auto b = args.Get("budget-mib");
      b && (!absl::SimpleAtoi(*b, &budget_mib) || budget_mib < 1 || budget_mib > (int64_t{1} << 30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--budget-mib must be a positive integer (at most 2^30), got \"", *b, "\""));
  }
  ASSIGN_OR_RETURN(const int warmup, IntFlagInRange(args, "warmup", 0, 0, 1000));
  ASSIGN_OR_RETURN(const int repeat, IntFlagInRange(args, "repeat", 1, 1, 1000));
  ASSIGN_OR_RETURN(const std::optional<uint64_t> seeded_weights, SeededWeightsFlag(args));
  if (mode == "exact" && (warmup > 0 || repeat > 1)) {
    return absl::InvalidArgumentError("--warmup and --repeat are for dense and tiled decodes");
  }
  ASSIGN_OR_RETURN(c10::Device device, device::ParseComputeDevice(args.Get("device").value_or("cpu")));
  if (mode == "exact" && (!device.is_cpu() || budget_mib > 0)) {
    return absl::InvalidArgumentError(
        "--mode exact runs local CPU ranks without a budget; GPU groups and budgets are vaedecode_server's");
  }
  RETURN_IF_ERROR(device::PrepareComputeDevice(device));
  ASSIGN_OR_RETURN(device::DeviceMemory * memory, device::InstallDeviceMemory(device));

  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(args.Get("model"), dtype, seeded_weights));
  if (!device.is_cpu()) {
    RETURN_IF_ERROR(worker::CatchExceptions("moving the weights", [&] { model.decoder->ToDevice(device); }));
  }

  at::Tensor latent;
  std::string latent_name;
  if (auto latent_path = args.Get("latent")) {
    ASSIGN_OR_RETURN(at::Tensor read, formats::ReadTensorFile(ResolveUserPath(*latent_path), "latent"));
    latent = read;
    latent_name = *latent_path;
  } else {
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape(args.Get("latent-shape").value_or(kDemoLatentShape)));
    uint64_t seed = kDemoLatentSeed;
    if (auto s = args.Get("seed"); s && !absl::SimpleAtoi(*s, &seed)) {
      return absl::InvalidArgumentError(absl::StrCat("--seed must be an integer, got \"", *s, "\""));
    }
    latent = DemoLatent(shape, seed);
    latent_name = absl::StrCat("demo(seed=", seed, ")");
  }

  // An audio latent to mux: decoded first, densely in float32 on this process.
  at::Tensor muxed_audio;
  int64_t muxed_audio_rate = 0;
  if (args.Get("audio-latent")) {
    ASSIGN_OR_RETURN(std::tie(muxed_audio, muxed_audio_rate),
                     DecodeMuxedAudio(args, request, latent.dim() > 0 ? latent.size(0) : 0));
  } else if (args.Get("audio-model") || args.Get("audio-latent-space")) {
    return absl::InvalidArgumentError("--audio-model and --audio-latent-space go with --audio-latent");
  }

  const auto start = std::chrono::steady_clock::now();
  families::Decoder& decoder = *model.decoder;
  // Tiles are sized from the model's measured peaks, as a service worker's
  // are (calibrated once, before any budget applies).
  std::optional<tiling::PeakProfile> profile;
  if (mode == "tiled") {
    ASSIGN_OR_RETURN(
        tiling::PeakProfile loaded,
        tiling::LoadOrCalibrate(decoder, tiling::ProbeOf(*memory), tiling::CalibrationSides(decoder.device()),
                                memory->backend(), tiling::DefaultProfileDir()));
    profile = loaded;
  }
  // The request's options against the model, as the server checks them.
  v1::ModelInfo model_info;
  worker::DescribeModel(model, profile.value_or(tiling::PeakProfile{}), ranks, &model_info);
  RETURN_IF_ERROR(rpc::ValidateDecodeOptions(request, model_info));
  RETURN_IF_ERROR(rpc::ValidateOutputFormat(request, model_info));
  const worker::DecodeJob job = worker::JobFromRequest(request, latent);
  ASSIGN_OR_RETURN(const std::vector<int64_t> stream_chunks, StreamChunksFlag(args, latent, decoder));
  if (!stream_chunks.empty() && (mode == "tiled" || warmup > 0 || repeat > 1)) {
    return absl::InvalidArgumentError("--stream-chunks decodes dense or exact, once (no tiles, --warmup or --repeat)");
  }
  if (!stream_chunks.empty() && job.noise_scale != 0) {
    // As the service's sessions (which take no noise): noise drawn for each
    // chunk would not be the whole clip's.
    return absl::InvalidArgumentError(
        "--stream-chunks mixes no decode noise (noise drawn a chunk at a time is not the whole clip's): pass "
        "--decode-noise-scale 0, or mix the noise into the latent first");
  }
  // Budgets count beyond the loaded model (it is not the decode's), and
  // apply before the group reports its free memory.
  if (budget_mib > 0) {
    RETURN_IF_ERROR(memory->SetBudget(memory->current_bytes() + (budget_mib << 20)));
  }
  GroupLaunch launch;
  launch.ranks = ranks;
  launch.model_path = args.Get("model").value_or("");
  launch.seeded_weights = seeded_weights;
  launch.dtype_name = families::DtypeName(dtype);
  launch.threads = at::get_num_threads();
  launch.timeout = absl::Seconds(timeout_s);
  const std::string model_name = model.name;
  ASSIGN_OR_RETURN(std::unique_ptr<LocalGroup> group, LocalGroup::Start(launch, std::move(model)));
  worker::GroupRuntime& runtime = group->runtime();

  // The service's path: plan once, run the plan on the group.
  worker::PlanningContext planning;
  planning.requested = worker::PlannedMode(*parsed_mode);
  planning.world_size = runtime.world_size();
  planning.profile = profile ? &*profile : nullptr;
  RunFigures run;
  worker::GroupJob group_job;
  absl::StatusOr<worker::DecodeOutcome> outcome;
  if (!stream_chunks.empty()) {
    // The whole latent's plan names the output (its shape, the header's mode).
    planning.free_bytes_per_rank = runtime.free_bytes_per_rank();
    ASSIGN_OR_RETURN(group_job.plan, worker::PlanDecode(decoder, job, planning));
    outcome = DecodeInChunks(runtime, decoder, request, latent, planning, stream_chunks, halo_overlap == "on", out);
    if (!outcome.ok()) return outcome.status();
    run.decode_ms.push_back(outcome->result.decode_ms);
  }
  for (int i = 0; i < (stream_chunks.empty() ? warmup + repeat : 0); ++i) {
    outcome = absl::UnknownError("not run");  // the previous output is not the next decode's
    // One rank: its free bytes now (the previous run's output released);
    // a group: as its ranks last reported them, as the service plans.
    planning.free_bytes_per_rank =
        runtime.world_size() == 1 ? std::vector<int64_t>{memory->free_bytes()} : runtime.free_bytes_per_rank();
    ASSIGN_OR_RETURN(worker::DecodePlan plan, worker::PlanDecode(decoder, job, planning));
    group_job.plan = std::move(plan);
    group_job.plan.overlap_halo = halo_overlap == "on";
    run.before_bytes = memory->current_bytes();
    run.budget_bytes = planning.free_bytes_per_rank.empty() ? -1 : planning.free_bytes_per_rank[0];
    outcome = runtime.Run(group_job);
    if (!outcome.ok()) return outcome.status();
    if (i >= warmup) run.decode_ms.push_back(outcome->result.decode_ms);
  }
  (void)(memory)->SetBudget(0);  // writing the output is not the decode's
  RETURN_IF_ERROR(group->Stop());
  std::string mode_used = worker::ModeName(outcome->result.mode);
  if (outcome->result.mode == worker::DecodeMode::kTiled || outcome->result.mode != planning.requested) {
    mode_used = absl::StrCat(mode_used, " (", outcome->result.reason, ")");
  }
  const std::string figures = Figures(decoder, group_job.plan, *outcome, profile ? &*profile : nullptr, run, warmup);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  // The output as the service streams it, assembled and written as its
  // client writes it.
  rpc::OutputAssembler assembled;
  AssemblingSink sink(assembled);
  worker::LeaderResponse response(sink, request, rpc::kDefaultMaxChunkBytes,
                                  decoder.OutputShape(group_job.plan.latent.sizes().vec()),
                                  families::DecodeDtypeReason(decoder.info(), dtype), decoder.info().pixels);
  if (muxed_audio.defined()) response.MuxAudio(muxed_audio, muxed_audio_rate);
  const absl::Status streamed = response.Finish(group_job.plan, *outcome, runtime.world_size());
  if (!sink.status().ok()) return sink.status();  // the assembler's error, not the stream's "caller gone"
  if (!streamed.ok()) return streamed;
  ASSIGN_OR_RETURN(std::vector<std::string> files, client::WriteOutput(out_file, assembled));
  const std::string written = absl::StrJoin(files, ",");
  const at::Tensor& result = outcome->result.sample;
  out << "decoded model=" << model_name << " family=" << decoder.info().family << " latent=" << latent_name
      << " latent_shape=" << ShapeText(latent.sizes()) << " space=" << space_name
      << " sample_shape=" << ShapeText(result.sizes()) << " dtype=" << families::DtypeName(decoder.dtype())
      << (decoder.dtype() != dtype ? " requested_dtype=" + families::DtypeName(dtype) + " (force_upcast)" : "")
      << " device=" << device.str() << " mode=" << mode_used << " ranks=" << ranks
      << " threads=" << at::get_num_threads() << " time_ms=" << static_cast<int64_t>(ms) << figures
      << " max_rss_mib=" << MaxRssMib() << " out=" << written << "\n";
  return absl::OkStatus();
}

absl::Status RunEncode(const ParsedArgs& args, std::ostream& out) {
  const std::optional<std::string> model_path = args.Get("model");
  const std::optional<std::string> image_path = args.Get("image");
  const std::optional<std::string> out_path = args.Get("out");
  if (!model_path || !image_path || !out_path) {
    return absl::InvalidArgumentError("encode needs --model DIR, --image FILE and --out FILE.safetensors");
  }
  // The encode options as every front end reads them (posterior, seed,
  // latent space), into the request a service would get.
  v1::EncodeRequest request;
  RETURN_IF_ERROR(ParseRequestOptions(args, rpc::EncodeOptions(), request));
  worker::EncodeJob job = worker::EncodeJobFromRequest(request, at::Tensor());
  const std::string mode = args.Get("mode").value_or("dense");
  if (mode != "dense" && mode != "exact") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be dense or exact for an encode, got \"", mode, "\""));
  }
  ASSIGN_OR_RETURN(const int ranks, IntFlagInRange(args, "ranks", 1, 1, 64));
  if (mode != "exact" && ranks != 1) return absl::InvalidArgumentError("--ranks needs --mode exact");
  ASSIGN_OR_RETURN(const int timeout_s, IntFlagInRange(args, "timeout-s", 120, 1, 86400));
  const std::string out_file = ResolveUserPath(*out_path);
  if (job.posterior == families::PosteriorOutput::kMoments && !absl::EndsWith(out_file, ".safetensors")) {
    return absl::InvalidArgumentError(
        "--posterior moments writes two tensors (mean, logvar): --out must be .safetensors");
  }
  ASSIGN_OR_RETURN(const int warmup, IntFlagInRange(args, "warmup", 0, 0, 1000));
  ASSIGN_OR_RETURN(const int repeat, IntFlagInRange(args, "repeat", 1, 1, 1000));
  ASSIGN_OR_RETURN(const std::optional<uint64_t> seeded_weights, SeededWeightsFlag(args));
  ASSIGN_OR_RETURN(at::ScalarType dtype, families::ParseDtype(args.Get("dtype").value_or("float32")));
  RETURN_IF_ERROR(ApplyThreads(args));
  ASSIGN_OR_RETURN(job.image, formats::ReadImageInput(ResolveUserPath(*image_path)));
  job.from_pixels = formats::IsPixelImagePath(ResolveUserPath(*image_path));
  const c10::Device device(c10::kCPU);  // the ranks' peaks are measured as a decode's are
  RETURN_IF_ERROR(device::PrepareComputeDevice(device));
  RETURN_IF_ERROR(device::InstallDeviceMemory(device).status());

  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(model_path, dtype, seeded_weights));
  const std::string model_name = model.name;
  GroupLaunch launch;
  launch.ranks = ranks;
  launch.model_path = *model_path;
  launch.seeded_weights = seeded_weights;
  launch.dtype_name = families::DtypeName(dtype);
  launch.threads = at::get_num_threads();
  launch.timeout = absl::Seconds(timeout_s);
  ASSIGN_OR_RETURN(std::unique_ptr<LocalGroup> group, LocalGroup::Start(launch, std::move(model)));
  worker::GroupRuntime& runtime = group->runtime();
  // The service's path: load the encoder, prepare and plan on the leader, run the plan on the group.
  ASSIGN_OR_RETURN(families::Encoder * encoder, runtime.Encoder(0));
  ASSIGN_OR_RETURN(at::Tensor image, worker::PrepareImage(*encoder, job));
  worker::GroupJob group_job;
  group_job.kind = worker::JobKind::kEncode;
  group_job.encode = worker::PlanEncode(
      *encoder, image, mode == "exact" ? worker::DecodeMode::kExact : worker::DecodeMode::kDense, runtime.world_size());
  // Timed runs after untimed warm-ups; encode_ms is their median.
  std::vector<double> encode_ms;
  absl::StatusOr<worker::EncodeOutcome> ran = absl::UnknownError("not run");
  for (int i = 0; i < warmup + repeat; ++i) {
    ran = runtime.RunEncode(group_job);
    if (!ran.ok()) return ran.status();
    if (i >= warmup) encode_ms.push_back(ran->encode_ms);
  }
  const worker::EncodeOutcome& outcome = *ran;
  RETURN_IF_ERROR(group->Stop());
  std::sort(encode_ms.begin(), encode_ms.end());
  const double median = encode_ms.size() % 2 == 1
                            ? encode_ms[encode_ms.size() / 2]
                            : (encode_ms[encode_ms.size() / 2 - 1] + encode_ms[encode_ms.size() / 2]) / 2;
  ASSIGN_OR_RETURN(worker::EncodeResult result, worker::FinishEncode(*encoder, outcome.moments, job));
  if (result.latent.defined()) {
    RETURN_IF_ERROR(formats::WriteTensorFile(out_file, "latent", result.latent));
  } else {
    RETURN_IF_ERROR(formats::WriteTensorsFile(out_file, {{"mean", result.mean}, {"logvar", result.logvar}}));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string mode_used = worker::ModeName(outcome.mode);
  if (!group_job.encode.reason.empty()) absl::StrAppend(&mode_used, " (", group_job.encode.reason, ")");
  std::vector<std::string> times;
  for (const worker::RankStats& r : outcome.ranks) times.push_back(absl::StrFormat("%.0f", r.decode_ms));
  out << "encoded model=" << model_name << " family=" << encoder->info().family << " image=" << *image_path
      << " image_shape=" << ShapeText(job.image.sizes())
      << " latent_shape=" << ShapeText((result.latent.defined() ? result.latent : result.mean).sizes())
      << " posterior=" << families::PosteriorOutputName(job.posterior)
      << (result.seed ? absl::StrCat(" seed=", *result.seed) : "")
      << " space=" << (job.latent_space == families::LatentSpace::kRaw ? "raw" : "vae")
      << " dtype=" << families::DtypeName(encoder->dtype()) << " mode=" << mode_used << " ranks=" << ranks
      << " threads=" << at::get_num_threads() << " time_ms=" << static_cast<int64_t>(ms)
      << " encode_ms=" << absl::StrFormat("%.1f", median) << " repeat=" << repeat << " peak_mib=["
      << MibList(outcome.ranks) << "] rank_encode_ms=[" << absl::StrJoin(times, ",")
      << "] collectives=" << outcome.comm.collectives() << " max_rss_mib=" << MaxRssMib() << " out=" << out_file
      << "\n";
  return absl::OkStatus();
}

absl::Status RunInfo(const ParsedArgs& args, std::ostream& out) {
  ASSIGN_OR_RETURN(worker::NamedModel model, LoadModel(args.Get("model"), at::kFloat));
  const families::ModelInfo& m = model.decoder->info();
  out << "model: " << model.name << "\n"
      << "family: " << m.family << " (diffusers " << m.diffusers_class << ")\n"
      << "parameters: " << m.parameter_count << "\n"
      << "latent channels: " << m.latent_channels << "\n"
      << "output channels: " << m.out_channels << "\n";
  if (m.is_audio && m.sample_rate == 0) {
    out << "audio: latents to mel spectrograms (no vocoder); decoded dense in float32\n";
  } else if (m.is_audio) {
    out << "audio: latents to waveforms at " << m.sample_rate << " Hz, " << m.samples_per_latent
        << " samples per latent frame; decoded dense in float32\n";
  } else {
    out << "spatial factor: " << m.spatial_factor << "\n";
  }
  if (m.is_video) out << "temporal factor: " << m.temporal_factor << "\n";
  out << "scaling factor: " << m.scaling_factor << "\n"
      << "shift factor: " << (m.shift_factor ? absl::StrCat(*m.shift_factor) : "none") << "\n"
      << "raw latent space: " << m.raw_to_vae_formula << "\n";
  if (!m.spatial_tiling && !m.is_audio) out << "tiled mode: not available (decoded whole or exactly sharded)\n";
  if (!m.decode_note.empty()) out << "note: " << m.decode_note << "\n";
  out << "libtorch: " << worker::LibTorchSummary() << "\n"
      << "config: " << m.config_json << "\n";
  return absl::OkStatus();
}

}  // namespace vaedecode::cli
