#include "families/weight_loading.h"

#include <cmath>
#include <cstring>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::families {
namespace {

constexpr size_t kMaxListed = 40;

std::string ShapeString(c10::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

std::string ListSome(const std::vector<std::string>& items) {
  if (items.size() <= kMaxListed) return absl::StrJoin(items, ", ");
  std::vector<std::string> head(items.begin(), items.begin() + kMaxListed);
  return absl::StrCat(absl::StrJoin(head, ", "), ", … (", items.size() - kMaxListed, " more)");
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>((Next() >> 40) * (1.0 / (1ULL << 23)) - 1.0); }

 private:
  uint64_t state_;
};

}  // namespace

void SeedParameters(torch::nn::Module& module, uint64_t seed) {
  SplitMix64 rng(seed);
  at::NoGradGuard no_grad;
  // Weights first, then the bias of the same layer, in named_parameters order.
  std::map<std::string, int64_t> fan_in;
  for (const auto& item : module.named_parameters()) {
    if (absl::EndsWith(item.key(), ".weight") && item.value().dim() >= 2) {
      const std::string layer = item.key().substr(0, item.key().size() - 7);
      fan_in[layer] = item.value().numel() / item.value().size(0);
    }
  }
  for (auto& item : module.named_parameters()) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    const std::string layer = name.substr(0, name.rfind('.'));
    auto it = fan_in.find(layer);
    if (it == fan_in.end()) {  // a norm: identity affine (Wan's RMS norms call the scale gamma)
      p.fill_(absl::EndsWith(name, ".weight") || absl::EndsWith(name, ".gamma") ? 1.0 : 0.0);
      continue;
    }
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(it->second)));
    at::Tensor values = at::empty({p.numel()}, at::kFloat);
    float* data = values.data_ptr<float>();
    for (int64_t i = 0; i < p.numel(); ++i) data[i] = bound * rng.Symmetric();
    p.copy_(values.view(p.sizes()));
  }
}

bool IgnoreRules::Ignores(const std::string& key) const {
  for (const std::string& p : prefixes) {
    if (absl::StartsWith(key, p)) return true;
  }
  for (const std::string& n : names) {
    if (key == n) return true;
  }
  return false;
}

absl::StatusOr<at::Tensor> FloatTensorFromView(const formats::TensorView& view) {
  at::ScalarType type;
  switch (view.dtype) {
    case formats::DType::kF32:
      type = at::kFloat;
      break;
    case formats::DType::kF16:
      type = at::kHalf;
      break;
    case formats::DType::kBF16:
      type = at::kBFloat16;
      break;
    case formats::DType::kF64:
      type = at::kDouble;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor ", view.name, " has dtype ",
                                                     std::string(formats::DTypeName(view.dtype)),
                                                     "; a floating-point tensor is required"));
  }
  at::Tensor out = at::empty(view.shape, at::TensorOptions().dtype(type));
  if (view.nbytes > 0) std::memcpy(out.data_ptr(), view.data, view.nbytes);  // data may be unaligned
  return out;
}

absl::Status LoadStrict(torch::nn::Module& module, const TensorMap& tensors, const IgnoreRules& ignore,
                        const std::string& source) {
  std::vector<std::string> missing, mismatched, bad_dtype, non_finite;
  std::map<std::string, bool> used;

  auto fill = [&](const std::string& name, at::Tensor& target) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(name);
      return;
    }
    used[name] = true;
    const formats::TensorView& view = *it->second;
    if (c10::IntArrayRef(view.shape) != target.sizes()) {
      mismatched.push_back(
          absl::StrCat(name, " (checkpoint ", ShapeString(view.shape), ", model ", ShapeString(target.sizes()), ")"));
      return;
    }
    absl::StatusOr<at::Tensor> value = FloatTensorFromView(view);
    if (!value.ok()) {
      bad_dtype.push_back(absl::StrCat(name, " (", std::string(formats::DTypeName(view.dtype)), ")"));
      return;
    }
    // A NaN or Inf weight would make every output NaN: refused by name
    // (a corrupt or half-written checkpoint), not served.
    if (!at::isfinite(*value).all().item<bool>()) {
      non_finite.push_back(name);
      return;
    }
    at::NoGradGuard no_grad;
    target.copy_(*value);
  };

  for (auto& item : module.named_parameters(/*recurse=*/true)) fill(item.key(), item.value());
  for (auto& item : module.named_buffers(/*recurse=*/true)) fill(item.key(), item.value());

  std::vector<std::string> unexpected;
  for (const auto& [name, view] : tensors) {
    if (!used.count(name) && !ignore.Ignores(name)) unexpected.push_back(name);
  }

  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat(missing.size(), " missing: ", ListSome(missing)));
  }
  if (!unexpected.empty()) {
    problems.push_back(absl::StrCat(unexpected.size(), " unexpected: ", ListSome(unexpected)));
  }
  if (!mismatched.empty()) {
    problems.push_back(absl::StrCat(mismatched.size(), " with the wrong shape: ", ListSome(mismatched)));
  }
  if (!non_finite.empty()) {
    problems.push_back(absl::StrCat(non_finite.size(), " holding NaN or Inf: ", ListSome(non_finite)));
  }
  if (!bad_dtype.empty()) {
    problems.push_back(absl::StrCat(bad_dtype.size(), " not floating-point: ", ListSome(bad_dtype)));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(source, " does not match the model: ", absl::StrJoin(problems, "; ")));
}

int64_t CountParameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) total += p.numel();
  return total;
}

}  // namespace vaedecode::families
