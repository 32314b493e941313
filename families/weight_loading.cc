#include "families/weight_loading.h"

#include <cstring>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::families {
namespace {

constexpr size_t kMaxListed = 40;

std::string ShapeString(c10::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ListSome(const std::vector<std::string>& items) {
  if (items.size() <= kMaxListed) return absl::StrJoin(items, ", ");
  std::vector<std::string> head(items.begin(), items.begin() + kMaxListed);
  return absl::StrCat(absl::StrJoin(head, ", "), ", … (", items.size() - kMaxListed, " more)");
}

}  // namespace

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
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", view.name, " has dtype ", std::string(formats::DTypeName(view.dtype)),
          "; a floating-point tensor is required"));
  }
  at::Tensor out = at::empty(view.shape, at::TensorOptions().dtype(type));
  if (view.nbytes > 0) std::memcpy(out.data_ptr(), view.data, view.nbytes);  // data may be unaligned
  return out;
}

absl::Status LoadStrict(torch::nn::Module& module, const TensorMap& tensors,
                        const IgnoreRules& ignore, const std::string& source) {
  std::vector<std::string> missing, mismatched, bad_dtype;
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
      mismatched.push_back(absl::StrCat(name, " (checkpoint ", ShapeString(view.shape),
                                        ", model ", ShapeString(target.sizes()), ")"));
      return;
    }
    absl::StatusOr<at::Tensor> value = FloatTensorFromView(view);
    if (!value.ok()) {
      bad_dtype.push_back(absl::StrCat(name, " (", std::string(formats::DTypeName(view.dtype)), ")"));
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
  if (!bad_dtype.empty()) {
    problems.push_back(absl::StrCat(bad_dtype.size(), " not floating-point: ", ListSome(bad_dtype)));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, " does not match the model: ", absl::StrJoin(problems, "; ")));
}

int64_t CountParameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) total += p.numel();
  return total;
}

}  // namespace vaedecode::families
