#pragma once

// Turns a decoded sample into the public API's output messages: the Header's
// shape fields and a sequence of Chunks, each at most `max_chunk_bytes` of
// data (a single row larger than that still goes alone), ordered by batch
// entry, then frame, then rows.
//
// Layouts (per chunk: one batch entry `b`, one frame `f`, rows [r0, r1)):
//  - OUTPUT_FLOAT32 / OUTPUT_FLOAT16: sample[b, :, (f,) r0:r1, :] in C order,
//    i.e. [C, rows, W] little-endian; header shape = the sample's NCHW/NCTHW.
//  - OUTPUT_UINT8: pixels[b, f, r0:r1] as [rows, W, C]; header shape
//    [B, H, W, C] or [B, T, H, W, C].
//  - OUTPUT_PNG / OUTPUT_JPEG: one image per (b, f); its bytes split over
//    consecutive chunks when larger than the limit (same b and f, rows 0..H).
//  - OUTPUT_MP4: one video per b (every frame), split the same way (f = 0).
//  - An audio VAE's waveform [B, C, S] is one image of S rows (samples) and
//    one column per b: a tensor chunk holds samples [r0, r1) of every channel
//    ([C, rows]); OUTPUT_WAV / OUTPUT_WAV_FLOAT32 one WAV file per b, its
//    channels interleaved, split like an MP4.

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "families/pixel_convention.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::worker {

// Fills shape, dtype, output_format, frames, height, width of `header`.
absl::Status DescribeOutput(const at::Tensor& sample, v1::OutputFormat format, v1::Header* header);
// The same from the sample's shape (NCHW / NCTHW), before it exists.
absl::Status DescribeOutput(const std::vector<int64_t>& sample_shape, v1::OutputFormat format, v1::Header* header);

// What a request asks the chunks to hold.
struct OutputEncoding {
  v1::OutputFormat format = v1::OUTPUT_FLOAT32;
  int jpeg_quality = 75;    // OUTPUT_JPEG only
  int png_compression = 6;  // OUTPUT_PNG only
  int fps = 16;             // OUTPUT_MP4 only
  int64_t sample_rate = 0;  // OUTPUT_WAV*: the waveform's samples per second
  // OUTPUT_MP4: an audio track for each batch entry, a waveform
  // [B, channels, samples] float32 on the CPU at audio_sample_rate.
  at::Tensor audio;
  int64_t audio_sample_rate = 0;
  // The model's pixel convention (ModelInfo::pixels): 8-bit outputs are
  // made from the sample in it (float outputs are the sample as it is).
  families::PixelConvention pixels;
};

// The encoding a request names (its JPEG quality defaulted) for a model
// whose samples follow `pixels` (an audio VAE's waveform: at `sample_rate`).
OutputEncoding EncodingOf(const v1::DecodeRequest& request, const families::PixelConvention& pixels = {},
                          int64_t sample_rate = 0);

// An audio model's decoded waveform [B', channels, samples] as the audio
// tracks of `clips` MP4s: float32 on the CPU, [clips, channels, samples].
// B' is `clips`, or for a mono model 2 · clips (MiniMax-H3's stereo: entries
// 2b and 2b + 1 are clip b's left and right channels); INVALID_ARGUMENT
// otherwise.
absl::StatusOr<at::Tensor> MuxableAudio(const at::Tensor& waveform, int64_t clips);

// Calls `emit` with each chunk; stops early (returning CANCELLED) when emit
// returns false.
absl::Status EmitChunks(const at::Tensor& sample, const OutputEncoding& encoding, int64_t max_chunk_bytes,
                        const std::function<bool(v1::Chunk&&)>& emit);

}  // namespace vaedecode::worker
