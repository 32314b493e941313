#include "rpc/request_options.h"

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "rpc/modes.h"
#include "rpc/output_formats.h"

namespace vaedecode::rpc {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<std::pair<int, std::vector<std::string>>> ModeChoices() {
  std::vector<std::pair<int, std::vector<std::string>>> out;
  const google::protobuf::EnumDescriptor* e = v1::Mode_descriptor();
  for (int i = 0; i < e->value_count(); ++i) {
    const auto mode = static_cast<v1::Mode>(e->value(i)->number());
    out.push_back({mode, {ModeName(mode)}});
  }
  return out;
}

std::vector<std::pair<int, std::vector<std::string>>> FormatChoices() {
  std::vector<std::pair<int, std::vector<std::string>>> out;
  for (const OutputFormatInfo& f : OutputFormats()) {
    std::vector<std::string> names = {f.name};
    names.insert(names.end(), f.aliases.begin(), f.aliases.end());
    out.push_back({f.format, names});
  }
  return out;
}

std::vector<OptionInfo> MakeTable() {
  std::vector<OptionInfo> t;
  const auto add = [&t](OptionInfo o) { t.push_back(std::move(o)); };
  add({"latent_space",
       OptionKind::kChoice,
       kHttp | kOip | kCli | kClient,
       {{v1::LATENT_SPACE_VAE, {"vae"}}, {v1::LATENT_SPACE_RAW, {"raw"}}},
       0,
       0,
       "",
       "vae: the tensor vae.decode takes; raw: the denoiser's output, de-normalised as the model's pipeline does"});
  add({"mode", OptionKind::kChoice, kHttp | kOip | kClient, ModeChoices(), 0, 0, "",
       "how the group decodes: auto (chosen from free memory), dense, exact (row bands over the group) or tiled"});
  add({"output_format", OptionKind::kChoice, kOip | kClient, FormatChoices(), 0, 0, "",
       "what comes back: float32, float16, uint8 tensors, or png / jpeg / mp4 / wav / wav_float32 files"});
  add({"jpeg_quality", OptionKind::kInteger, kHttp | kOip | kCli | kClient, {}, 1, 100, "75", "JPEG quality"});
  add({"png_compression",
       OptionKind::kInteger,
       kHttp | kOip | kCli | kClient,
       {},
       0,
       9,
       "6",
       "PNG zlib level: 0 encodes fastest (largest files), 9 smallest"});
  add({"fps", OptionKind::kInteger, kHttp | kOip | kCli | kClient, {}, 1, 240, "16", "MP4 frame rate"});
  add({"scaling_factor",
       OptionKind::kNumber,
       kHttp | kOip | kCli | kClient,
       {},
       -kInf,
       kInf,
       "the model's own",
       "raw latents: z / scaling_factor + shift_factor instead of the model's formula"});
  add({"shift_factor",
       OptionKind::kNumber,
       kHttp | kOip | kCli | kClient,
       {},
       -kInf,
       kInf,
       "0",
       "raw latents: see scaling_factor"});
  add({"decode_timestep",
       OptionKind::kNumber,
       kHttp | kOip | kCli | kClient,
       {},
       0,
       kInf,
       "0",
       "timestep-conditioned decoders (LTX): the decode timestep"});
  add({"decode_noise_scale",
       OptionKind::kNumber,
       kHttp | kOip | kCli | kClient,
       {},
       0,
       kInf,
       "the decode timestep",
       "LTX: the scale of the noise mixed into the latent"});
  add({"noise_seed",
       OptionKind::kUnsigned,
       kHttp | kOip | kCli | kClient,
       {},
       0,
       0,
       "drawn (and returned)",
       "LTX: the decode noise's seed"});
  add({"audio_output",
       OptionKind::kChoice,
       kHttp | kOip | kCli | kClient,
       {{v1::AUDIO_OUTPUT_WAVEFORM, {"waveform"}}, {v1::AUDIO_OUTPUT_MEL, {"mel"}}},
       0,
       0,
       "",
       "audio VAEs with a vocoder (LTX-2): the waveform, or the mel spectrogram it is made from"});
  add({"audio_model",
       OptionKind::kName,
       kHttp | kOip | kClient,
       {},
       0,
       0,
       "",
       "an audio latent muxed into the MP4: the audio VAE (with a vocoder) that decodes it"});
  add({"audio_latent_space",
       OptionKind::kChoice,
       kHttp | kOip | kCli | kClient,
       {{v1::LATENT_SPACE_VAE, {"vae"}}, {v1::LATENT_SPACE_RAW, {"raw"}}},
       0,
       0,
       "",
       "an audio latent muxed into the MP4: its space, as latent_space"});
  return t;
}

std::vector<OptionInfo> MakeEncodeTable() {
  std::vector<OptionInfo> t;
  const unsigned everywhere = kHttp | kOip | kCli | kClient;
  t.push_back({"posterior",
               OptionKind::kChoice,
               everywhere,
               {{v1::POSTERIOR_MEAN, {"mean", "argmax"}},
                {v1::POSTERIOR_SAMPLE, {"sample"}},
                {v1::POSTERIOR_MOMENTS, {"moments"}}},
               0,
               0,
               "",
               "mean (what edit and I2V pipelines use), a seeded sample, or the moments (mean and log-variance)"});
  t.push_back({"seed",
               OptionKind::kUnsigned,
               everywhere,
               {},
               0,
               0,
               "drawn (and returned)",
               "posterior sample: torch.Generator().manual_seed(seed)'s draw on the CPU, as diffusers does"});
  t.push_back({"latent_space",
               OptionKind::kChoice,
               everywhere,
               {{v1::LATENT_SPACE_VAE, {"vae"}}, {v1::LATENT_SPACE_RAW, {"raw"}}},
               0,
               0,
               "",
               "vae: the encoder's latent; raw: normalised as the model's pipeline feeds its denoiser"});
  t.push_back({"mode", OptionKind::kChoice, kHttp | kOip | kClient, ModeChoices(), 0, 0, "",
               "how the group encodes: auto, dense or exact (row bands over the group); encodes are not tiled"});
  return t;
}

const std::vector<OptionInfo>& Table() {
  static const auto* table = new std::vector<OptionInfo>(MakeTable());
  return *table;
}

const FieldDescriptor* Field(const OptionInfo& option, const google::protobuf::Descriptor* message) {
  return message->FindFieldByName(option.name);
}

const FieldDescriptor* Field(const OptionInfo& option) { return Field(option, v1::DecodeRequest::descriptor()); }

absl::Status Bad(const OptionInfo& option, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(option.name, ": ", why));
}

std::string Show(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return absl::StrCat("\"", v, "\"");
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else {
          return absl::StrCat(v);
        }
      },
      value);
}

// The value as a double, for the numeric kinds; nullopt for text that is
// not a number, and for a bool or a choice.
std::optional<double> AsNumber(const OptionValue& value) {
  if (const auto* s = std::get_if<std::string>(&value)) {
    double d = 0;
    if (!absl::SimpleAtod(*s, &d)) return std::nullopt;
    return d;
  }
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  if (const auto* d = std::get_if<double>(&value)) return *d;
  return std::nullopt;
}

}  // namespace

std::string OptionInfo::CliFlag() const { return absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}})); }

std::string OptionInfo::Accepted() const {
  switch (kind) {
    case OptionKind::kChoice: {
      std::vector<std::string> names;
      for (const auto& [value, spellings] : choices) names.push_back(spellings[0]);
      return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "), " or ", names.back());
    }
    case OptionKind::kInteger:
      return absl::StrCat("an integer ", min, "..", max);
    case OptionKind::kUnsigned:
      return "an integer 0..2^64-1";
    case OptionKind::kNumber:
      if (min > -kInf && max < kInf) return absl::StrCat("a number ", min, "..", max);
      if (min > -kInf) return absl::StrCat("a number >= ", min);
      return "a finite number";
    case OptionKind::kName:
      return absl::StrCat("a name of at most ", kMaxNameLength, " characters");
  }
  return "";
}

absl::Span<const OptionInfo> RequestOptions() { return Table(); }

const OptionInfo* FindRequestOption(absl::string_view name) {
  const std::string field = absl::StrReplaceAll(name, {{"-", "_"}});
  for (const OptionInfo& o : Table()) {
    if (o.name == field) return &o;
  }
  return nullptr;
}

absl::Span<const OptionInfo> EncodeOptions() {
  static const auto* table = new std::vector<OptionInfo>(MakeEncodeTable());
  return *table;
}

namespace {

absl::Status SetMessageOption(const OptionInfo& option, const OptionValue& value, google::protobuf::Message& request) {
  const FieldDescriptor* field = Field(option, request.GetDescriptor());
  if (field == nullptr) return Bad(option, "not an option of this request");
  const Reflection* reflection = request.GetReflection();
  const std::string use = absl::StrCat("; use ", option.Accepted());
  switch (option.kind) {
    case OptionKind::kChoice: {
      const auto* text = std::get_if<std::string>(&value);
      if (text != nullptr) {
        const std::string lower = absl::AsciiStrToLower(*text);
        for (const auto& [number, spellings] : option.choices) {
          for (const std::string& s : spellings) {
            if (s == lower) {
              reflection->SetEnumValue(&request, field, number);
              return absl::OkStatus();
            }
          }
        }
      }
      return Bad(option, absl::StrCat(Show(value), use));
    }
    case OptionKind::kInteger: {
      const std::optional<double> d = AsNumber(value);
      if (!d || *d != std::floor(*d) || *d < option.min || *d > option.max) {
        return Bad(option, absl::StrCat(Show(value), use));
      }
      reflection->SetInt32(&request, field, static_cast<int32_t>(*d));
      return absl::OkStatus();
    }
    case OptionKind::kUnsigned: {
      uint64_t n = 0;
      bool ok = false;
      if (const auto* s = std::get_if<std::string>(&value)) {
        ok = absl::SimpleAtoi(*s, &n);
      } else if (const auto* i = std::get_if<int64_t>(&value)) {
        ok = *i >= 0;
        n = static_cast<uint64_t>(*i);
      } else if (const auto* u = std::get_if<uint64_t>(&value)) {
        ok = true;
        n = *u;
      }
      if (!ok) return Bad(option, absl::StrCat(Show(value), use));
      reflection->SetUInt64(&request, field, n);
      return absl::OkStatus();
    }
    case OptionKind::kNumber: {
      const std::optional<double> d = AsNumber(value);
      if (!d || !std::isfinite(*d) || *d < option.min || *d > option.max) {
        return Bad(option, absl::StrCat(Show(value), use));
      }
      reflection->SetDouble(&request, field, *d);
      return absl::OkStatus();
    }
    case OptionKind::kName: {
      const auto* text = std::get_if<std::string>(&value);
      if (text == nullptr || text->empty() || text->size() > kMaxNameLength) {
        return Bad(option,
                   text == nullptr ? absl::StrCat(Show(value), use) : absl::StrCat(text->size(), " characters", use));
      }
      reflection->SetString(&request, field, *text);
      return absl::OkStatus();
    }
  }
  return Bad(option, "unknown kind");
}

}  // namespace

absl::Status SetOption(const OptionInfo& option, const OptionValue& value, v1::DecodeRequest& request) {
  return SetMessageOption(option, value, request);
}

absl::Status SetOption(const OptionInfo& option, const OptionValue& value, v1::EncodeRequest& request) {
  return SetMessageOption(option, value, request);
}

absl::Status CheckOptionRanges(const v1::DecodeRequest& request) {
  const Reflection* reflection = request.GetReflection();
  for (const OptionInfo& option : Table()) {
    const FieldDescriptor* field = Field(option);
    if (field->has_presence() && !reflection->HasField(request, field)) continue;
    const std::string use = absl::StrCat("; use ", option.Accepted());
    switch (option.kind) {
      case OptionKind::kChoice: {
        const int number = reflection->GetEnumValue(request, field);
        bool known = false;
        for (const auto& [value, spellings] : option.choices) known = known || value == number;
        if (!known) return Bad(option, absl::StrCat("unknown value ", number, use));
        break;
      }
      case OptionKind::kInteger: {
        const int32_t v = reflection->GetInt32(request, field);
        if (field->has_presence() ? (v < option.min || v > option.max)
                                  : (v != 0 && (v < option.min || v > option.max))) {
          // A field without presence reads 0 when unset: 0 means the default.
          return Bad(option, field->has_presence() ? absl::StrCat(v, use)
                                                   : absl::StrCat(v, use, " (0: the default, ", option.unset, ")"));
        }
        break;
      }
      case OptionKind::kUnsigned:
        break;
      case OptionKind::kName:
        if (reflection->GetString(request, field).size() > kMaxNameLength) {
          return Bad(option, absl::StrCat("longer than ", kMaxNameLength, " characters"));
        }
        break;
      case OptionKind::kNumber: {
        const double v = reflection->GetDouble(request, field);
        if (!std::isfinite(v) || v < option.min || v > option.max) return Bad(option, absl::StrCat(v, use));
        break;
      }
    }
  }
  return absl::OkStatus();
}

namespace {

std::string UsageOf(absl::Span<const OptionInfo> table, Surface surface) {
  std::string out;
  for (const OptionInfo& o : table) {
    if ((o.surfaces & surface) == 0) continue;
    const std::string flag = surface == kCli ? o.CliFlag() : absl::StrCat("--", o.name);
    absl::StrAppend(&out, "  ", flag, " ", absl::AsciiStrToUpper(o.kind == OptionKind::kChoice ? "choice" : "value"),
                    ": ", o.help, "; ", o.Accepted(), o.unset.empty() ? "" : absl::StrCat(" (default ", o.unset, ")"),
                    "\n");
  }
  return out;
}

}  // namespace

std::string OptionUsage(Surface surface) { return UsageOf(Table(), surface); }

std::string EncodeOptionUsage(Surface surface) { return UsageOf(EncodeOptions(), surface); }

}  // namespace vaedecode::rpc
