#include "families/qwenimage/decoder.h"

#include "families/qwenimage/config.h"
#include "families/qwenimage/encoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage {

absl::StatusOr<std::unique_ptr<Decoder>> LoadQwenImage(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(wan::WanConfig config, QwenImageConfigFromJson(files.config(), files.config_path()));
  return wan::LoadWanFamily(QwenImageFamilySpec(), config, files, options);
}

void Register(Registry& registry) {
  const wan::WanFamily& spec = QwenImageFamilySpec();
  registry.Register(
      {spec.family, {spec.diffusers_class}, &LoadQwenImage, {wan::WanLineageKeys()}, &LoadQwenImageEncoder});
}

}  // namespace vaedecode::families::qwenimage
