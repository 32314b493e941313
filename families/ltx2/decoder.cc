#include "families/ltx2/decoder.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "families/ltx2/encoder.h"
#include "families/weight_loading.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2 {
namespace {

constexpr double kDecodeTimestep = 0.0;  // LTX2Pipeline's default decode_timestep

}  // namespace

AutoencoderKLLTX2VideoModuleImpl::AutoencoderKLLTX2VideoModuleImpl(const LTX2Config& c) {
  decoder = register_module("decoder", LTX2VideoDecoder3d(c));
  latents_mean = register_buffer("latents_mean", at::zeros({c.latent_channels}));
  latents_std = register_buffer("latents_std", at::ones({c.latent_channels}));
}

LTX2Decoder::LTX2Decoder(LTX2Config config, std::string config_json)
    : ModuleDecoder(AutoencoderKLLTX2VideoModule(config), {}, /*latent_halo_rows=*/1), config_(std::move(config)) {
  info_.family = "ltx2";
  info_.diffusers_class = "AutoencoderKLLTX2Video";
  info_.config_json = std::move(config_json);
  info_.unread_config_keys = config_.unread_keys;
  info_.config_warnings = config_.structure_warnings;
  info_.latent_channels = config_.latent_channels;
  info_.out_channels = config_.out_channels;
  info_.spatial_factor = config_.spatial_factor();
  info_.temporal_factor = config_.temporal_factor();
  info_.is_video = true;
  // The whole clip goes through every block at once (a causal decoder's
  // dense decode goes a latent frame at a time: the model errs safe there).
  info_.peak_latent_frames = 0;
  info_.cancel_with_halo = true;  // no GroupNorm, no attention
  info_.scaling_factor = config_.scaling_factor;
  // AutoencoderKLLTX2Video.tiled_decode: 512-pixel tiles every 448 pixels.
  info_.stock_tile = std::max<int64_t>(1, 512 / info_.spatial_factor);
  info_.stock_stride = std::max<int64_t>(1, 448 / info_.spatial_factor);
  info_.raw_to_vae_formula = "z * latents_std / scaling_factor + latents_mean (latents_mean/std: weights buffers)";
  info_.timestep_conditioning = config_.timestep_conditioning;
  if (config_.timestep_conditioning) {
    info_.raw_to_vae_formula +=
        "; timestep-conditioned decoder: decode_timestep (default 0) and decode_noise_scale as LTX2Pipeline";
  }
}

absl::Status LTX2Decoder::ValidateLatent(const at::Tensor& latent) const {
  RETURN_IF_ERROR(Decoder::ValidateLatent(latent));
  // Reflect padding by 1 needs 2 columns, as in diffusers. Rows cannot be
  // checked here: this also validates a rank's row band, which may be 1 row
  // (its reflect padding then reads the neighbour's halo row); a whole
  // 1-row latent fails in the conv, as it does in diffusers.
  if (config_.spatial_padding == PaddingMode::kReflect && latent.size(4) < 2) {
    return absl::InvalidArgumentError(absl::StrCat("latent width must be >= 2 for ", info_.diffusers_class,
                                                   "'s reflect padding, got ", latent.size(4)));
  }
  return absl::OkStatus();
}

at::Tensor LTX2Decoder::ToVaeSpace(const at::Tensor& raw) const {
  const int64_t c = config_.latent_channels;
  const auto type = raw.scalar_type();
  const at::Tensor mean = module_->latents_mean.view({1, c, 1, 1, 1}).to(type);
  const at::Tensor std = module_->latents_std.view({1, c, 1, 1, 1}).to(type);
  return raw * std / config_.scaling_factor + mean;
}

absl::Status LTX2Decoder::CheckStreaming() const {
  if (config_.decoder_causal) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "AutoencoderKLLTX2Video cannot be decoded chunk by chunk: its decoder is not causal in time (config "
      "decoder_causal false, as released), so each frame depends on the frames after it");
}

at::Tensor LTX2Decoder::Decode(const at::Tensor& z, LayerOps& ops) { return Decode(z, ops, DecodeConditioning{}); }

at::Tensor LTX2Decoder::Decode(const at::Tensor& z, LayerOps& ops, const DecodeConditioning& conditioning) {
  // A causal decoder's clip is one chunk of a fresh stream (DecodeStream:
  // any chunking of it then computes the same frames).
  if (config_.decoder_causal) return OpenStream(conditioning)->DecodeChunk(z, ops, /*clip_ends=*/true);
  at::NoGradGuard no_grad;
  return module_->decoder->forward(z.to(dtype()), ops, Timestep(z, conditioning));
}

at::Tensor LTX2Decoder::Timestep(const at::Tensor& z, const DecodeConditioning& conditioning) const {
  if (!config_.timestep_conditioning) return at::Tensor();
  // diffusers: torch.tensor(decode_timestep, dtype=latents.dtype), one per batch entry.
  return at::full({z.size(0)}, conditioning.timestep.value_or(kDecodeTimestep),
                  at::TensorOptions().dtype(dtype()).device(z.device()));
}

std::unique_ptr<DecodeStream> LTX2Decoder::OpenStream(const DecodeConditioning& conditioning) {
  if (!CheckStreaming().ok()) return nullptr;
  // The timestep conditioning is one scale and shift per batch entry, the
  // norms are per position and the upsamplers' depth-to-space per frame: the
  // causal convs' last input frames are all the state.
  return std::make_unique<StatefulDecodeStream<nn::CausalFrames>>(
      [this, conditioning](const at::Tensor& z, LayerOps& ops, nn::CausalFrames& frames, bool clip_ends) {
        frames.set_clip_ends(clip_ends);
        return module_->decoder->forward(z.to(dtype()), ops, Timestep(z, conditioning), &frames);
      });
}

void LTX2Decoder::ConvertWeights(at::ScalarType dtype) { module_->decoder->to(dtype); }

absl::StatusOr<std::unique_ptr<Decoder>> LoadLTX2(const ModelFiles& files, const LoadOptions& options) {
  // decode() never touches the encoder (released checkpoints hold it; the
  // decoder-only ones do not).
  return LoadModuleDecoder<LTX2Decoder>(files, options, {{"encoder."}, {}});
}

void Register(Registry& registry) {
  // Causal-conv wrappers (`.conv.`), parameter-free norms, latent statistics
  // buffers: LTX-Video's checkpoints look the same.
  registry.Register({"ltx2",
                     {"AutoencoderKLLTX2Video"},
                     &LoadLTX2,
                     {{{"AutoencoderKLLTX2Video", "AutoencoderKLLTXVideo"},
                       {{"decoder.conv_in.conv.weight", 5}, {"latents_mean", 1}},
                       {"decoder.conv_norm_out.weight"}}},
                     &LoadLTX2Encoder});
}

}  // namespace vaedecode::families::ltx2
