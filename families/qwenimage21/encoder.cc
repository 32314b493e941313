#include "families/qwenimage21/encoder.h"

#include "families/qwenimage21/config.h"
#include "families/wan/encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage21 {

absl::StatusOr<std::unique_ptr<Encoder>> LoadQwenImage21Encoder(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(wan::WanConfig config, QwenImage21ConfigFromJson(files.config(), files.config_path()));
  return wan::LoadWanFamilyEncoder(QwenImage21FamilySpec(), config, files, options);
}

}  // namespace vaedecode::families::qwenimage21
