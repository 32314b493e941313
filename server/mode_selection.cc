#include "server/mode_selection.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::server {
namespace {

bool Supports(const v1::ModelInfo& model, v1::Mode mode) {
  if (mode == v1::MODE_DENSE) return true;  // every decoder runs whole
  return std::any_of(model.supported_modes().begin(), model.supported_modes().end(),
                     [mode](int m) { return m == mode; });
}

std::string SupportedList(const v1::ModelInfo& model) {
  std::vector<std::string> names = {"DENSE"};
  for (int m : model.supported_modes()) {
    if (m != v1::MODE_DENSE) names.push_back(ModeName(static_cast<v1::Mode>(m)));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace

std::string ModeName(v1::Mode mode) {
  switch (mode) {
    case v1::MODE_AUTO:
      return "AUTO";
    case v1::MODE_DENSE:
      return "DENSE";
    case v1::MODE_EXACT:
      return "EXACT";
    case v1::MODE_TILED:
      return "TILED";
    default:
      return absl::StrCat("MODE_", static_cast<int>(mode));
  }
}

absl::StatusOr<ModeChoice> SelectMode(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                                      const GroupResources& group) {
  switch (request.mode()) {
    case v1::MODE_DENSE:
      return ModeChoice{v1::MODE_DENSE, "requested"};
    case v1::MODE_TILED:
      return absl::UnimplementedError(
          "mode: TILED is not implemented yet; use AUTO, DENSE or EXACT");
    case v1::MODE_EXACT:
      if (group.degree < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mode: EXACT needs a worker group of at least 2 ranks; this server's groups have ",
            group.degree, " (use AUTO or DENSE)"));
      }
      if (!Supports(model, v1::MODE_EXACT)) {
        return absl::InvalidArgumentError(
            absl::StrCat("mode: model \"", model.name(), "\" (", model.family(),
                         ") cannot be decoded in EXACT mode; it supports ", SupportedList(model)));
      }
      return ModeChoice{v1::MODE_EXACT, "requested"};
    case v1::MODE_AUTO:
      if (group.degree < 2) return ModeChoice{v1::MODE_DENSE, "group has one rank"};
      if (!Supports(model, v1::MODE_EXACT)) {
        return ModeChoice{v1::MODE_DENSE,
                          absl::StrCat("model family ", model.family(), " cannot shard exactly")};
      }
      return ModeChoice{v1::MODE_EXACT, absl::StrCat("auto: exact over ", group.degree, " ranks")};
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: unknown value ", static_cast<int>(request.mode())));
  }
}

}  // namespace vaedecode::server
