#include "families/wan/decoder.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/wan/blocks.h"
#include "families/wan/encoder.h"
#include "families/weight_loading.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::wan {

absl::StatusOr<std::unique_ptr<WanDecoder>> WanDecoder::Create(const WanFamily& family, WanConfig config,
                                                               std::string config_json) {
  const UpBlockType wanted = config.up_block_type();
  if (std::find(family.up_blocks.begin(), family.up_blocks.end(), wanted) == family.up_blocks.end()) {
    std::vector<std::string> accepted;
    for (UpBlockType t : family.up_blocks) accepted.push_back(UpBlockTypeName(t));
    return absl::InvalidArgumentError(absl::StrCat(family.diffusers_class, " config needs ", UpBlockTypeName(wanted),
                                                   " blocks; this family is built from ",
                                                   absl::StrJoin(accepted, ", ")));
  }
  return std::unique_ptr<WanDecoder>(new WanDecoder(family, std::move(config), std::move(config_json)));
}

namespace {

ModelInfo Describe(const WanFamily& family, const WanConfig& config, std::string config_json) {
  ModelInfo info;
  info.family = family.family;
  info.diffusers_class = family.diffusers_class;
  info.config_json = std::move(config_json);
  info.unread_config_keys = config.unread_keys;
  info.config_warnings = config.structure_warnings;
  info.latent_channels = config.z_dim;
  info.out_channels = config.image_channels();
  info.spatial_factor = config.spatial_factor();
  // An image-only model (Qwen-Image-2.1) decodes its one frame to one.
  info.temporal_factor = config.image_convs ? 1 : config.temporal_factor();
  info.is_video = true;
  info.peak_latent_frames = 1;  // frame by frame, through the causal cache
  // diffusers' tiles: 256-pixel tiles every 192 pixels, in latents (Wan 2.2
  // and Qwen-Image-2.1 compress 16x: 16 every 12, not Wan 2.1's 32 every 24).
  info.stock_tile = std::max<int64_t>(1, 256 / info.spatial_factor);
  info.stock_stride = std::max<int64_t>(1, 192 / info.spatial_factor);
  info.scaling_factor = 1.0;
  info.raw_to_vae_formula =
      family.decode_multiplies_by_std ? "z * latents_std + latents_mean" : "z / (1 / latents_std) + latents_mean";
  return info;
}

}  // namespace

// Every layer's halo at the latent resolution is at most one row (blocks.h).
WanDecoder::WanDecoder(const WanFamily& family, WanConfig config, std::string config_json)
    : ModuleBackedDecoder(Describe(family, config, std::move(config_json)), /*latent_halo_rows=*/1),
      config_(std::move(config)),
      multiplies_by_std_(family.decode_multiplies_by_std),
      module_(std::make_shared<AutoencoderKLWanImpl>(config_)) {
  AdoptModule(*module_);
}

WanDecoder::~WanDecoder() = default;

torch::nn::Module& WanDecoder::parameters_module() { return *module_; }

absl::Status WanDecoder::ValidateLatent(const at::Tensor& latent) const {
  RETURN_IF_ERROR(Decoder::ValidateLatent(latent));
  if (config_.image_convs && latent.size(2) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("a latent of ", latent.size(2), " frames cannot be decoded by ",
                                                   info().diffusers_class,
                                                   ": it decodes images (T = 1; its convolutions are 2-D)"));
  }
  return absl::OkStatus();
}

absl::Status WanDecoder::CheckStreaming() const {
  if (!config_.image_convs) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(info().diffusers_class, " decodes single images (T = 1): there are no frames to stream"));
}

at::Tensor WanDecoder::ToVaeSpace(const at::Tensor& raw) const {
  const int64_t c = config_.z_dim;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(raw.device());
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
  if (multiplies_by_std_) {
    // QwenImage21Pipeline: latents * latents_std + latents_mean, the statistics in
    // the VAE's dtype; here in float32 (a reduced-precision decoder's latents are
    // de-normalised in float32, then cast).
    const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(fp32).view({1, c, 1, 1, 1});
    return raw.to(at::kFloat) * std + mean;
  }
  // As WanPipeline / QwenImagePipeline write it, in fp32:
  // std = 1.0 / tensor(latents_std); latents / std + mean.
  const at::Tensor inv_std =
      at::reciprocal(at::tensor(config_.latents_std, at::kDouble).to(fp32)).view({1, c, 1, 1, 1});
  return raw.to(at::kFloat) / inv_std + mean;
}

std::unique_ptr<DecodeStream> WanDecoder::OpenStream(const DecodeConditioning&) {
  if (!CheckStreaming().ok()) return nullptr;
  return NewStream();
}

// diffusers' chunk loop with its feature cache kept between calls.
std::unique_ptr<DecodeStream> WanDecoder::NewStream() {
  return std::make_unique<StatefulDecodeStream<WanDecodeState>>(
      [&module = *module_, dtype = dtype()](const at::Tensor& z, LayerOps& ops, WanDecodeState& state, bool) {
        return module.DecodeFrames(z.to(dtype), ops, state);
      },
      /*step_announces_frames=*/true);
}

at::Tensor WanDecoder::Decode(const at::Tensor& z, LayerOps& ops) {
  return NewStream()->DecodeChunk(z, ops, /*clip_ends=*/true);
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadWanFamily(const WanFamily& family, const WanConfig& config,
                                                       const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<WanDecoder> decoder, WanDecoder::Create(family, config, files.config().dump(2)));
  // decode() never touches the encoder side; those keys are ignored by name.
  IgnoreRules ignore{{"encoder.", "quant_conv."}, {}};
  RETURN_IF_ERROR(FillWeights(decoder->module(), files, ignore, options));
  return std::unique_ptr<Decoder>(std::move(decoder));
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadWan(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(WanConfig config, WanConfig::FromJson(files.config(), files.config_path()));
  return LoadWanFamily(WanFamilySpec(), config, files, options);
}

KeySignature WanLineageKeys() {
  return {{"AutoencoderKLWan", "AutoencoderKLQwenImage"},
          {{"decoder.conv_in.weight", 5}, {"decoder.norm_out.gamma", 0}},
          {}};
}

void Register(Registry& registry) {
  const WanFamily& spec = WanFamilySpec();
  registry.Register({spec.family, {spec.diffusers_class}, &LoadWan, {WanLineageKeys()}, &LoadWanEncoder});
}

}  // namespace vaedecode::families::wan
