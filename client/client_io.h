#pragma once

// The client's files: latents in (.safetensors, .npy, or a seeded demo
// latent), decoded outputs out (.safetensors / .npy tensors, .png images),
// with the same conventions as the `vaedecode` CLI. No torch.
//
// Thread-safe: no shared state.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/output_assembler.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::client {

// Reads a latent: a .safetensors file's only tensor (or the one named
// "latent") or a .npy array, of dtype F32, F16, BF16 or F64 (F64 is sent as
// FLOAT32). INVALID_ARGUMENT naming the file otherwise.
absl::StatusOr<v1::Tensor> ReadLatent(const std::string& path);

// Reads an image (or clip) to encode into `request`: a .png / .jpg / .jpeg
// / .mp4 file's bytes as encoded_image (the server decodes it), or a tensor as
// ReadLatent reads one (the one named "image" when there are several).
absl::Status ReadImage(const std::string& path, v1::EncodeRequest& request);

// `request` as the Encode stream sends it: the first message with every
// field, the image's bytes continued `piece_bytes` at a time by the next.
std::vector<v1::EncodeRequest> EncodePieces(const v1::EncodeRequest& request, int64_t piece_bytes);

// A FLOAT32 latent of `shape` with N(0, 1) entries from std::mt19937_64
// seeded with `seed` (deterministic, but not the CLI's torch.randn values).
v1::Tensor DemoLatent(const std::vector<int64_t>& shape, uint64_t seed);

// Writes a finished stream's output to `path` (the output format an --out
// path asks for is rpc::FormatForExtension's):
//   .safetensors / .npy   one tensor "sample" in the header's shape and dtype;
//   .png / .jpg           the files as received; one image → `path`, N > 1
//                         images → stem_0.png …, video → stem_f000.png …,
//                         N > 1 videos → stem_0_f000.png … (the CLI's names);
//   .mp4                  one video per batch entry: `path`, or stem_<b>.mp4.
// `tensor_name` names the tensor of a .safetensors file.
// Returns the files written.
absl::StatusOr<std::vector<std::string>> WriteOutput(const std::string& path, const rpc::OutputAssembler& output,
                                                     const std::string& tensor_name = "sample");

// Writes a finished encode's latent like `vaedecode encode`: .safetensors
// with "latent", or for moments ([B, 2C, ...]) "mean" and "logvar" split on
// channels; .npy holds the one tensor (not moments).
absl::StatusOr<std::vector<std::string>> WriteEncodeOutput(const std::string& path, const rpc::OutputAssembler& output,
                                                           bool moments);

}  // namespace vaedecode::client
