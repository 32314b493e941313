#include "families/qwenimage21/decoder.h"

#include "families/qwenimage21/config.h"
#include "families/qwenimage21/encoder.h"
#include "families/wan/decoder.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::qwenimage21 {

absl::StatusOr<std::unique_ptr<Decoder>> LoadQwenImage21(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(wan::WanConfig config, QwenImage21ConfigFromJson(files.config(), files.config_path()));
  return wan::LoadWanFamily(QwenImage21FamilySpec(), config, files, options);
}

void Register(Registry& registry) {
  const wan::WanFamily& spec = QwenImage21FamilySpec();
  // Its checkpoints are Wan's with 4-D convs.
  const KeySignature keys{{spec.diffusers_class}, {{"decoder.conv_in.weight", 4}, {"decoder.norm_out.gamma", 0}}, {}};
  registry.Register({spec.family, {spec.diffusers_class}, &LoadQwenImage21, {keys}, &LoadQwenImage21Encoder});
}

}  // namespace vaedecode::families::qwenimage21
