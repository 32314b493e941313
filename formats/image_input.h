#pragma once

// An encode's input from what users have: PNG or JPEG pixels turned into
// the tensor diffusers' VaeImageProcessor.preprocess feeds vae.encode
// (x = p / 255 · 2 − 1, float32, [1, C, H, W]), or a tensor file as it is.

#include <cstdint>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace vaedecode::formats {

// [1, C, H, W] float32 in [-1, 1] from HWC 8-bit pixels (C = 1, 3 or 4).
at::Tensor ImageTensorFromPixels(int width, int height, int channels, const uint8_t* pixels);

// PNG or JPEG bytes (told apart by their signature) as ImageTensorFromPixels
// makes them; INVALID_ARGUMENT naming what the bytes are not.
absl::StatusOr<at::Tensor> DecodeImageBytes(const std::string& bytes);

// True for the paths ReadImageInput decodes as 8-bit pixels (.png, .jpg, .jpeg).
bool IsPixelImagePath(const std::string& path);

// By extension: .png, .jpg / .jpeg through DecodeImageBytes; .safetensors
// (one tensor, or the one named "image") and .npy as ReadTensorFile reads
// them ([B, C, H, W] or [B, C, T, H, W], values in [-1, 1]).
absl::StatusOr<at::Tensor> ReadImageInput(const std::string& path);

}  // namespace vaedecode::formats
