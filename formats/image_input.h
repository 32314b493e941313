#pragma once

// An encode's input from what users have: PNG or JPEG pixels turned into
// the tensor diffusers' VaeImageProcessor.preprocess feeds vae.encode
// (x = p / 255 · 2 − 1, float32, [1, C, H, W]), an MP4's frames the same way
// as a clip ([1, 3, T, H, W], as VideoProcessor.preprocess_video makes
// them), or a tensor file as it is.

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "formats/image_bytes.h"

namespace vaedecode::formats {

// [1, C, H, W] (a still image) or [1, C, T, H, W] (an MP4) float32 in
// [-1, 1] from 8-bit pixels.
at::Tensor ImageTensorFromPixels(const Pixels& pixels);

// PNG, JPEG or MP4 bytes (told apart by their signature) as
// ImageTensorFromPixels makes them; INVALID_ARGUMENT naming what the bytes
// are not.
absl::StatusOr<at::Tensor> DecodeImageBytes(const std::string& bytes);

// True for the paths ReadImageInput decodes as 8-bit pixels (.png, .jpg, .jpeg, .mp4).
bool IsPixelImagePath(const std::string& path);

// By extension: .png, .jpg / .jpeg, .mp4 through DecodeImageBytes; .safetensors
// (one tensor, or the one named "image") and .npy as ReadTensorFile reads
// them ([B, C, H, W] or [B, C, T, H, W], values in [-1, 1]).
absl::StatusOr<at::Tensor> ReadImageInput(const std::string& path);

}  // namespace vaedecode::formats
