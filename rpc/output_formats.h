#pragma once

// The output formats as data: one row per v1::OutputFormat saying what it
// holds, how it streams and how each front end names and labels it. The
// validation, the worker's header and chunks, the response assembler, the
// OIP and HTTP replies and the client's files all read this table, so a new
// format is one row here plus its encoder in the worker
// (worker/output_stream.cc).
//
// Thread-safe: immutable after the first use.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// How a format's chunks carry the output (vaedecode.v1.Chunk).
enum class Chunking {
  kRowBands,      // row bands of each image and frame (sample ranges of a waveform), as they become final
  kFilePerImage,  // one file per image and frame (possibly in pieces)
  kFilePerEntry,  // one file per batch entry (an MP4's every frame, a WAV's every sample): sent once it is done
};

// What a decode makes, which decides the formats it can be written in.
enum class OutputKind {
  kImage,        // [B, C, H, W]
  kVideo,        // [B, C, T, H, W]
  kWaveform,     // [B, channels, samples] (an audio VAE)
  kSpectrogram,  // [B, C, frames, mel_bins] (an audio VAE's mel stage)
};

struct OutputFormatInfo {
  v1::OutputFormat format;
  std::string name;                  // what the OIP parameter and the client flag read: "float16"
  std::vector<std::string> aliases;  // also read: "jpg"
  v1::DType dtype;                   // the tensor's, or the pixels' an encoded file holds
  bool encoded;                      // files (PNG, JPEG, MP4), not a tensor
  bool channels_last;                // [B, (T,) H, W, C] rather than the sample's [B, C, (T,) H, W]
  std::vector<int64_t> channels;     // the output channels it can hold; empty: any
  std::vector<OutputKind> kinds;     // the outputs it can hold; empty: any
  Chunking chunking;
  std::string mime_type;                // of one file, or of the raw tensor
  std::vector<std::string> extensions;  // of the client's and CLI's --out files; empty: .safetensors / .npy
  std::string oip_datatype;             // the OIP output's datatype
  std::string help;
};

// Every format, in the enum's order.
absl::Span<const OutputFormatInfo> OutputFormats();
// The row of `format`; nullptr for an unknown value.
const OutputFormatInfo* FindOutputFormat(v1::OutputFormat format);
// The row a name or alias names (any case); INVALID_ARGUMENT
// "\"gif\"; use float32, float16, ..." otherwise.
absl::StatusOr<const OutputFormatInfo*> ParseOutputFormat(absl::string_view name);
// The encoded format an --out path's extension asks for (.png, .jpg, .mp4),
// the default float32 tensor for .safetensors and .npy; INVALID_ARGUMENT
// listing the extensions otherwise.
absl::StatusOr<v1::OutputFormat> FormatForExtension(absl::string_view path);
// Bytes per element of `dtype`'s tensors (FLOAT32 4, FLOAT16 and BFLOAT16 2,
// UINT8 1); 0 for an unknown value.
int64_t ElementSize(v1::DType dtype);

// INVALID_ARGUMENT when an output of `channels` (0 when unknown) and `kind`
// cannot be written in `format`: naming the format, what it needs and what
// `subject` (e.g. `model "sd"`) has.
absl::Status CheckOutputFits(v1::OutputFormat format, int64_t channels, OutputKind kind, absl::string_view subject);

// What a model's decode of `request` makes: a video model's clips, an audio
// VAE's waveform or (asked, or without a vocoder) mel spectrogram, images.
OutputKind OutputKindOf(const v1::ModelInfo& model, const v1::DecodeRequest& request);

// "images", "video", "audio waveforms", "mel spectrograms": for messages.
const char* OutputKindName(OutputKind kind);

}  // namespace vaedecode::rpc
