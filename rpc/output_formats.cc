#include "rpc/output_formats.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::rpc {
namespace {

std::vector<OutputFormatInfo> MakeTable() {
  return {
      {v1::OUTPUT_FLOAT32,
       "float32",
       {},
       v1::FLOAT32,
       false,
       false,
       {},
       {},
       Chunking::kRowBands,
       "application/octet-stream",
       {},
       "FP32",
       "the decoder's output, [B, C, (T,) H, W] float32 in [-1, 1]"},
      {v1::OUTPUT_FLOAT16,
       "float16",
       {},
       v1::FLOAT16,
       false,
       false,
       {},
       {},
       Chunking::kRowBands,
       "application/octet-stream",
       {},
       "FP16",
       "the same as float16"},
      {v1::OUTPUT_UINT8,
       "uint8",
       {},
       v1::UINT8,
       false,
       true,
       {1, 3, 4},
       {OutputKind::kImage, OutputKind::kVideo},
       Chunking::kRowBands,
       "application/octet-stream",
       {},
       "UINT8",
       "pixels, [B, (T,) H, W, C] uint8 (clamp(x/2+0.5, 0, 1)*255 rounded)"},
      {v1::OUTPUT_PNG,
       "png",
       {},
       v1::UINT8,
       true,
       true,
       {1, 3, 4},
       {OutputKind::kImage, OutputKind::kVideo},
       Chunking::kFilePerImage,
       "image/png",
       {".png"},
       "BYTES",
       "one PNG per image and frame"},
      {v1::OUTPUT_JPEG,
       "jpeg",
       {"jpg"},
       v1::UINT8,
       true,
       true,
       {1, 3},
       {OutputKind::kImage, OutputKind::kVideo},
       Chunking::kFilePerImage,
       "image/jpeg",
       {".jpg", ".jpeg"},
       "BYTES",
       "one baseline JPEG per image and frame"},
      {v1::OUTPUT_MP4,
       "mp4",
       {},
       v1::UINT8,
       true,
       true,
       {3},
       {OutputKind::kVideo},
       Chunking::kFilePerEntry,
       "video/mp4",
       {".mp4"},
       "BYTES",
       "video models: one H.264 yuv420p MP4 per batch entry"},
      {v1::OUTPUT_WAV,
       "wav",
       {},
       v1::FLOAT32,
       true,
       false,
       {},
       {OutputKind::kWaveform},
       Chunking::kFilePerEntry,
       "audio/wav",
       {".wav"},
       "BYTES",
       "audio VAEs: one 16-bit PCM WAV per batch entry, its channels interleaved"},
      {v1::OUTPUT_WAV_FLOAT32,
       "wav_float32",
       {},
       v1::FLOAT32,
       true,
       false,
       {},
       {OutputKind::kWaveform},
       Chunking::kFilePerEntry,
       "audio/wav",
       {".wav"},
       "BYTES",
       "the same with 32-bit float samples"},
  };
}

const std::vector<OutputFormatInfo>& Table() {
  static const auto* table = new std::vector<OutputFormatInfo>(MakeTable());
  return *table;
}

std::string Names() {
  std::vector<std::string> names;
  for (const OutputFormatInfo& f : Table()) names.push_back(f.name);
  return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "), " or ", names.back());
}

}  // namespace

absl::Span<const OutputFormatInfo> OutputFormats() { return Table(); }

const OutputFormatInfo* FindOutputFormat(v1::OutputFormat format) {
  for (const OutputFormatInfo& f : Table()) {
    if (f.format == format) return &f;
  }
  return nullptr;
}

absl::StatusOr<const OutputFormatInfo*> ParseOutputFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const OutputFormatInfo& f : Table()) {
    if (f.name == lower || std::find(f.aliases.begin(), f.aliases.end(), lower) != f.aliases.end()) return &f;
  }
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\"; use ", Names()));
}

absl::StatusOr<v1::OutputFormat> FormatForExtension(absl::string_view path) {
  const std::string lower = absl::AsciiStrToLower(path);
  std::vector<std::string> known = {".safetensors", ".npy"};
  for (const OutputFormatInfo& f : Table()) {
    for (const std::string& ext : f.extensions) {
      if (absl::EndsWith(lower, ext)) return f.format;
      known.push_back(ext);
    }
  }
  if (absl::EndsWith(lower, ".safetensors") || absl::EndsWith(lower, ".npy")) return v1::OUTPUT_FLOAT32;
  return absl::InvalidArgumentError(absl::StrCat("--out ", path, ": extension must be ", absl::StrJoin(known, ", ")));
}

int64_t ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    case v1::UINT8:
      return 1;
    default:
      return 0;
  }
}

const char* OutputKindName(OutputKind kind) {
  switch (kind) {
    case OutputKind::kImage:
      return "images";
    case OutputKind::kVideo:
      return "video";
    case OutputKind::kWaveform:
      return "audio waveforms";
    case OutputKind::kSpectrogram:
      return "mel spectrograms";
  }
  return "?";
}

OutputKind OutputKindOf(const v1::ModelInfo& model, const v1::DecodeRequest& request) {
  if (model.is_audio()) {
    return model.sample_rate() == 0 || request.audio_output() == v1::AUDIO_OUTPUT_MEL ? OutputKind::kSpectrogram
                                                                                      : OutputKind::kWaveform;
  }
  return model.is_video() ? OutputKind::kVideo : OutputKind::kImage;
}

absl::Status CheckOutputFits(v1::OutputFormat format, int64_t channels, OutputKind kind, absl::string_view subject) {
  const OutputFormatInfo* f = FindOutputFormat(format);
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("output_format: unknown value ", static_cast<int>(format)));
  }
  if (!f->kinds.empty() && std::find(f->kinds.begin(), f->kinds.end(), kind) == f->kinds.end()) {
    std::vector<std::string> fitting;  // the formats this output can be written in
    for (const OutputFormatInfo& other : Table()) {
      if (other.kinds.empty() || std::find(other.kinds.begin(), other.kinds.end(), kind) != other.kinds.end()) {
        fitting.push_back(other.name);
      }
    }
    std::vector<std::string> needs;
    for (OutputKind k : f->kinds) needs.push_back(OutputKindName(k));
    return absl::InvalidArgumentError(absl::StrCat("output_format: ", f->name, " holds ", absl::StrJoin(needs, " or "),
                                                   "; ", subject, " decodes ", OutputKindName(kind), " (use ",
                                                   absl::StrJoin(fitting, ", "), ")"));
  }
  const bool channels_ok = f->channels.empty() || channels == 0 ||
                           std::find(f->channels.begin(), f->channels.end(), channels) != f->channels.end();
  if (channels_ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "output_format: ", f->name, " needs ",
      f->channels.size() == 1
          ? absl::StrCat(f->channels[0])
          : absl::StrCat(absl::StrJoin(f->channels.begin(), f->channels.end() - 1, ", "), " or ", f->channels.back()),
      " output channels; ", subject, " has ", channels, f->format == v1::OUTPUT_JPEG ? " (use png)" : ""));
}

}  // namespace vaedecode::rpc
