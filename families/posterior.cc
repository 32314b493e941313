#include "families/posterior.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"

namespace vaedecode::families {

std::string PosteriorOutputName(PosteriorOutput output) {
  switch (output) {
    case PosteriorOutput::kSample:
      return "sample";
    case PosteriorOutput::kMoments:
      return "moments";
    case PosteriorOutput::kMean:
      break;
  }
  return "mean";
}

Posterior SplitMoments(const at::Tensor& moments) {
  TORCH_CHECK(moments.dim() >= 2 && moments.size(1) % 2 == 0, "moments need an even channel count, got shape ",
              moments.sizes());
  const int64_t c = moments.size(1) / 2;
  return {moments.narrow(1, 0, c), at::clamp(moments.narrow(1, c, c), -30.0, 20.0)};
}

at::Tensor SeededNoise(at::IntArrayRef shape, uint64_t seed) {
  // torch.Generator() is a CPU generator; manual_seed(seed) seeds its mt19937.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor SamplePosterior(const Posterior& posterior, uint64_t seed) {
  const at::Tensor noise = SeededNoise(posterior.mean.sizes(), seed).to(posterior.mean.options());
  return posterior.mean + at::exp(0.5 * posterior.logvar) * noise;
}

}  // namespace vaedecode::families
