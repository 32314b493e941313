#include "families/ltx2_audio/decoder.h"

#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "families/input_checks.h"
#include "families/ltx2_audio/encoder.h"
#include "families/model_files.h"
#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::ltx2_audio {
namespace {

constexpr const char* kClass = "AutoencoderKLLTX2Audio";
constexpr const char* kVocoderClass = "LTX2Vocoder";

ModelInfo Describe(const LTX2AudioConfig& c, const std::optional<LTX2VocoderConfig>& vocoder, std::string config_json) {
  ModelInfo info;
  info.family = "ltx2_audio";
  info.diffusers_class = kClass;
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.latent_channels = c.latent_channels;
  info.is_audio = true;
  info.spatial_tiling = false;
  // Latent mel bins the decoder takes: enough to upsample to mel_bins, or
  // (mel_bins null) what the vocoder's input needs (ValidateLatent's rule).
  const int64_t upsample = int64_t{1} << (c.levels() - 1);
  info.latent_bins = c.mel_bins > 0 ? (c.mel_bins + upsample - 1) / upsample
                     : vocoder      ? std::max<int64_t>(1, vocoder->in_channels / c.output_channels)
                                    : 16;
  info.mel_frames_per_latent = LTX2AudioConfig::kLatentDownsampleFactor;
  info.mel_bins = c.mel_bins;
  info.raw_to_vae_formula =
      "packed [B, L, C*M]: x * latents_std + latents_mean over the C*M features, then unpacked to [B, C, L, M]";
  if (vocoder) {
    info.out_channels = vocoder->out_channels;
    info.sample_rate = vocoder->output_sampling_rate;
    info.samples_per_latent = LTX2AudioConfig::kLatentDownsampleFactor * vocoder->hop();
    info.unread_config_keys.insert(info.unread_config_keys.end(), vocoder->unread_keys.begin(),
                                   vocoder->unread_keys.end());
  } else {
    info.out_channels = c.output_channels;
    info.decode_note = "no vocoder/ folder beside or inside the VAE's: decodes to the mel spectrogram";
  }
  return info;
}

// The folder's vocoder: `vocoder/` inside the VAE's folder, or beside it
// (the LTX-2 repository's audio_vae/ + vocoder/); null when neither has a config.
absl::StatusOr<std::unique_ptr<ModelFiles>> OpenVocoder(const ModelFiles& files, const LoadOptions& options) {
  namespace fs = std::filesystem;
  // Absolute and without a trailing separator, so "audio_vae/" and "." have a parent folder.
  std::error_code ec;
  fs::path dir = fs::absolute(files.vae_dir(), ec).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  for (const fs::path& candidate : {dir / "vocoder", dir.parent_path() / "vocoder"}) {
    if (!fs::is_regular_file(candidate / "config.json", ec)) continue;
    // The class first (a folder of another vocoder class is refused by name, whatever its weights).
    ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> config_only,
                     ModelFiles::Open(candidate.string(), ModelFiles::Weights::kIgnored));
    if (config_only->class_name() != kVocoderClass) {
      return absl::InvalidArgumentError(absl::StrCat(config_only->config_path(), ": the vocoder's class is \"",
                                                     config_only->class_name(), "\"; ", kClass, " decodes through ",
                                                     kVocoderClass,
                                                     config_only->class_name() == "LTX2VocoderWithBWE"
                                                         ? " (LTX-2.3's bandwidth-extension vocoder is not supported)"
                                                         : ""));
    }
    if (options.seeded_weights) return config_only;
    ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> vocoder, ModelFiles::Open(candidate.string()));
    return vocoder;
  }
  return std::unique_ptr<ModelFiles>();
}

absl::StatusOr<std::unique_ptr<Decoder>> LoadLTX2Audio(const ModelFiles& files, const LoadOptions& options) {
  ASSIGN_OR_RETURN(LTX2AudioConfig config, LTX2AudioConfig::FromJson(files.config(), files.config_path()));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> vocoder_files, OpenVocoder(files, options));
  std::optional<LTX2VocoderConfig> vocoder;
  if (vocoder_files) {
    ASSIGN_OR_RETURN(vocoder, LTX2VocoderConfig::FromJson(vocoder_files->config(), vocoder_files->config_path()));
    // With a fixed mel_bins the widths must agree now; a null one is checked per latent.
    if (config.mel_bins > 0 && config.output_channels * config.mel_bins != vocoder->in_channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          vocoder_files->config_path(), ": in_channels ", vocoder->in_channels, " is not the mel spectrogram's ",
          config.output_channels, " channels x ", config.mel_bins, " mel_bins of ", files.config_path()));
    }
  }
  auto decoder = std::make_unique<LTX2AudioDecoder>(config, vocoder, files.config().dump(2));
  // decode() never reads the encoder side.
  RETURN_IF_ERROR(FillWeights(*decoder->module()->vae, files, {{"encoder."}, {}}, options));
  if (vocoder_files) RETURN_IF_ERROR(FillWeights(*decoder->module()->vocoder, *vocoder_files, {}, options));
  return decoder;
}

}  // namespace

AudioVaeModuleImpl::AudioVaeModuleImpl(const LTX2AudioConfig& c) {
  decoder = register_module("decoder", AudioDecoder(c));
  latents_mean = register_buffer("latents_mean", at::zeros({c.base_channels}));
  latents_std = register_buffer("latents_std", at::ones({c.base_channels}));
}

LTX2AudioModuleImpl::LTX2AudioModuleImpl(const LTX2AudioConfig& c, const std::optional<LTX2VocoderConfig>& v) {
  vae = register_module("vae", AudioVaeModule(c));
  if (v) vocoder = register_module("vocoder", Vocoder(*v));
}

LTX2AudioDecoder::LTX2AudioDecoder(LTX2AudioConfig config, std::optional<LTX2VocoderConfig> vocoder,
                                   std::string config_json)
    : ModuleDecoder(LTX2AudioModule(config, vocoder), Describe(config, vocoder, std::move(config_json)),
                    /*latent_halo_rows=*/0),
      config_(std::move(config)),
      vocoder_(std::move(vocoder)) {}

int64_t LTX2AudioDecoder::MelBins(int64_t latent_bins) const {
  // diffusers' target: the config's mel_bins, or (null) the latent's own bin count.
  return config_.mel_bins > 0 ? config_.mel_bins : latent_bins;
}

absl::Status LTX2AudioDecoder::ValidateLatent(const at::Tensor& latent) const { return ValidateLatentFor(latent, {}); }

absl::Status LTX2AudioDecoder::ValidateLatentFor(const at::Tensor& latent,
                                                 const DecodeConditioning& conditioning) const {
  const int64_t c = config_.latent_channels;
  int64_t bins = 0;
  if (latent.dim() == 3) {
    // The pipeline's packed [B, L, C·M].
    InputRule rule{"latent", kClass, "expects", latent.size(1)};
    rule.is_audio = true;  // three dims, every one non-empty, floating
    RETURN_IF_ERROR(CheckInputTensor(latent, rule));
    if (latent.size(2) % c != 0) {
      return absl::InvalidArgumentError(absl::StrCat("packed latent [B, L, C*M] has ", latent.size(2),
                                                     " features, not a multiple of ", kClass, "'s ", c,
                                                     " latent channels"));
    }
    bins = latent.size(2) / c;
  } else {
    InputRule rule{"latent", kClass, "expects", c};
    rule.is_spectrogram = true;
    RETURN_IF_ERROR(CheckInputTensor(latent, rule));
    bins = latent.size(3);
  }
  // Only a waveform goes through the vocoder.
  if (vocoder_ && !conditioning.mel_spectrogram && config_.output_channels * MelBins(bins) != vocoder_->in_channels) {
    return absl::InvalidArgumentError(absl::StrCat("latent of ", bins, " mel bins decodes to ", MelBins(bins),
                                                   " mel bins; the vocoder takes ", vocoder_->in_channels, " / ",
                                                   config_.output_channels, " channels"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> LTX2AudioDecoder::OutputShape(const std::vector<int64_t>& shape) const {
  return OutputShapeFor(shape, {});
}

std::vector<int64_t> LTX2AudioDecoder::OutputShapeFor(const std::vector<int64_t>& shape,
                                                      const DecodeConditioning& conditioning) const {
  const bool packed = shape.size() == 3;
  const int64_t frames = config_.MelFrames(packed ? shape[1] : shape[2]);
  if (vocoder_ && !conditioning.mel_spectrogram) return {shape[0], vocoder_->out_channels, vocoder_->Samples(frames)};
  return {shape[0], config_.output_channels, frames, MelBins(packed ? shape[2] / config_.latent_channels : shape[3])};
}

at::Tensor LTX2AudioDecoder::Unpacked(const at::Tensor& latent) const {
  if (latent.dim() != 3) return latent;
  // _unpack_audio_latents: [B, L, C·M] -> unflatten(2, (C, M)).transpose(1, 2).
  return latent.unflatten(2, {config_.latent_channels, latent.size(2) / config_.latent_channels}).transpose(1, 2);
}

at::Tensor LTX2AudioDecoder::ToVaeSpace(const at::Tensor& raw) const {
  // _pack_audio_latents for a 4-D latent: [B, C, L, M] -> [B, L, C·M].
  const at::Tensor packed = raw.dim() == 4 ? raw.transpose(1, 2).flatten(2, 3) : raw;
  const at::Tensor& mean = module_->vae->latents_mean;
  if (packed.size(2) != mean.numel()) {  // the request's fault, not the decoder's
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("latent: ", kClass, "'s latents_mean/latents_std cover ", mean.numel(),
                     " packed features (channels x latent mel bins); this raw latent has ", packed.size(2))));
  }
  const at::Tensor x = packed.to(at::kFloat) * module_->vae->latents_std.to(packed.device()) + mean.to(packed.device());
  return Unpacked(x).contiguous();
}

at::Tensor LTX2AudioDecoder::Decode(const at::Tensor& z, LayerOps& ops) { return Decode(z, ops, {}); }

at::Tensor LTX2AudioDecoder::Decode(const at::Tensor& z, LayerOps&, const DecodeConditioning& conditioning) {
  at::NoGradGuard no_grad;
  const at::Tensor mel = module_->vae->decoder->forward(Unpacked(z).to(at::kFloat).contiguous());
  if (!vocoder_ || conditioning.mel_spectrogram) return mel;
  return module_->vocoder->forward(mel);
}

void Register(Registry& registry) {
  registry.Register({"ltx2_audio",
                     {kClass},
                     &LoadLTX2Audio,
                     {{{kClass}, {{"decoder.conv_in.conv.weight", 4}, {"latents_mean", 1}}, {}}},
                     &LoadLTX2AudioEncoder,
                     /*audio=*/true});
}

}  // namespace vaedecode::families::ltx2_audio
