#pragma once

// Strict by-name loading of checkpoint tensors into a torch::nn::Module.
//
// Every parameter and buffer of the module must be filled from a checkpoint
// tensor of the same name and shape; every checkpoint tensor must be used or
// be on the family's ignore list. Anything else is one error listing every
// offender (missing, unexpected, mis-shaped, non-float).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/safetensors.h"

namespace torch::nn {
class Module;
}

namespace vaedecode::families {

using TensorMap = std::map<std::string, const formats::TensorView*>;

// Checkpoint keys a family deliberately does not use (e.g. the encoder).
struct IgnoreRules {
  std::vector<std::string> prefixes;  // "encoder." ignores every encoder key
  std::vector<std::string> names;     // exact keys
  bool Ignores(const std::string& key) const;
};

// Copies `tensors` into `module`'s parameters and buffers (converting to their
// dtype). `source` names the checkpoint in errors.
absl::Status LoadStrict(torch::nn::Module& module, const TensorMap& tensors, const IgnoreRules& ignore,
                        const std::string& source);

// Fills every parameter of `module` from `seed`, the same on every machine
// (SplitMix64, not LibTorch's RNG, whose streams differ between versions and
// devices): weights and their biases uniform in ±1/√fan_in, like LibTorch's
// default initialisation; parameters of layers without a weight of rank >= 2
// (norms) as the identity affine (weight 1, bias 0). Buffers keep their
// construction values.
void SeedParameters(torch::nn::Module& module, uint64_t seed);

// An owning CPU tensor with a view's contents, or an error for non-float dtypes.
absl::StatusOr<at::Tensor> FloatTensorFromView(const formats::TensorView& view);

// Sum of numel over a module's parameters.
int64_t CountParameters(const torch::nn::Module& module);

}  // namespace vaedecode::families
