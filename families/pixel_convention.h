#pragma once

// How a model's images relate to 8-bit pixels. diffusers' image VAEs take and
// give [-1, 1] (p / 255 · 2 − 1, VaeImageProcessor); a few are trained on
// another normalisation (MiniMax-H3: ImageNet's (p / 255 − mean) / std),
// which their pipelines apply around the VAE. Front ends convert pixels in
// the [-1, 1] convention; these maps carry that to and from a model's own.

#include <vector>

#include <ATen/core/Tensor.h>

namespace vaedecode::families {

struct PixelConvention {
  // Per channel; both empty for the [-1, 1] convention.
  std::vector<double> mean;
  std::vector<double> std;

  bool symmetric() const { return mean.empty(); }
  // [-1, 1]-convention images (channels on dim 1) in this convention: x
  // itself when symmetric, else ((x + 1) / 2 − mean) / std in float32.
  at::Tensor FromSymmetric(const at::Tensor& x) const;
  // The inverse, for the pixel writers: (x · std + mean) · 2 − 1 in float32
  // (x itself when symmetric).
  at::Tensor ToSymmetric(const at::Tensor& x) const;
};

}  // namespace vaedecode::families
