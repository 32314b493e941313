#include "families/input_checks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::families {

absl::Status CheckInputTensor(const at::Tensor& t, const InputRule& rule) {
  const int64_t want_dims = rule.is_audio ? 3 : rule.is_video ? 5 : 4;
  const char* layout = rule.is_audio         ? "[B, C, L]"
                       : rule.is_video       ? "[B, C, T, H, W]"
                       : rule.is_spectrogram ? "[B, C, L, M]"
                                             : "[B, C, H, W]";
  if (t.dim() != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat(rule.noun, " must be ", want_dims, "-D ", layout, " for ",
                                                   rule.diffusers_class, ", got shape [",
                                                   absl::StrJoin(t.sizes(), ", "), "]"));
  }
  if (t.size(1) != rule.channels) {
    return absl::InvalidArgumentError(absl::StrCat(rule.noun, " has ", t.size(1), " channels; ", rule.diffusers_class,
                                                   " ", rule.verb, " ", rule.channels));
  }
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(rule.noun, " has an empty dimension: shape [", absl::StrJoin(t.sizes(), ", "), "]"));
    }
  }
  if (!t.is_floating_point())
    return absl::InvalidArgumentError(absl::StrCat(rule.noun, " must be a floating-point tensor"));
  return absl::OkStatus();
}

}  // namespace vaedecode::families
