#include "families/qwenimage/decoder.h"

#include "families/qwenimage/config.h"

namespace vaedecode::families::qwenimage {

const wan::WanFamily& QwenImageFamilySpec() {
  static const wan::WanFamily* spec =
      new wan::WanFamily{"qwenimage", "AutoencoderKLQwenImage", {wan::UpBlockType::kUpBlock}};
  return *spec;
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadQwenImage(const ModelFiles& files, const LoadOptions& options) {
  absl::StatusOr<wan::WanConfig> config = QwenImageConfigFromJson(files.config(), files.config_path());
  if (!config.ok()) return config.status();
  return wan::LoadWanFamily(QwenImageFamilySpec(), *config, files, options);
}

void Register(Registry& registry) {
  const wan::WanFamily& spec = QwenImageFamilySpec();
  registry.Register({spec.family, {spec.diffusers_class}, &LoadQwenImage, {wan::WanLineageKeys()}});
}

}  // namespace vaedecode::families::qwenimage
