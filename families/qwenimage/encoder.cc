#include "families/qwenimage/encoder.h"

#include "families/qwenimage/config.h"
#include "families/wan/encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage {

absl::StatusOr<std::unique_ptr<Encoder>> LoadQwenImageEncoder(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(wan::WanConfig config, QwenImageConfigFromJson(files.config(), files.config_path()));
  return wan::LoadWanFamilyEncoder(QwenImageFamilySpec(), config, files, options);
}

}  // namespace vaedecode::families::qwenimage
