#pragma once

// The LTX-2 audio family: diffusers' AutoencoderKLLTX2Audio decode, then
// LTX2Vocoder, as LTX2Pipeline decodes audio. Latents [B, C, L, M] (or the
// pipeline's packed [B, L, C·M]) decode to the stereo mel spectrogram
// [B, 2, max(4L - 3, 1), mel_bins], which the vocoder turns into the
// waveform [B, 2, frames · hop] at its output_sampling_rate. The waveform is
// the default output; DecodeConditioning::mel_spectrogram asks for the mel.
// The vocoder is the folder's `vocoder/` (beside an `audio_vae/` folder, as
// the LTX-2 repository ships them, or inside the VAE's folder); without one
// the decode ends at the mel spectrogram.
//
// `raw` latents are de-normalised as the pipeline does: packed [B, L, C·M],
// x · latents_std + latents_mean over the C·M features (the checkpoint's
// buffers), then unpacked. Decoded densely in float32 (DecodeDtype).

#include <memory>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/ltx2_audio/blocks.h"
#include "families/ltx2_audio/config.h"
#include "families/ltx2_audio/vocoder.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::ltx2_audio {

// The decode-side state dict of AutoencoderKLLTX2Audio: decoder.*, latents_mean, latents_std.
class AudioVaeModuleImpl : public torch::nn::Module {
 public:
  explicit AudioVaeModuleImpl(const LTX2AudioConfig& config);

  AudioDecoder decoder{nullptr};
  at::Tensor latents_mean, latents_std;  // [base_channels], over the packed C·M features
};
TORCH_MODULE(AudioVaeModule);

// The VAE and, when the folder has one, the vocoder: each is filled from its
// own checkpoint (vae.* and vocoder.* here are their state dicts' roots).
class LTX2AudioModuleImpl : public torch::nn::Module {
 public:
  LTX2AudioModuleImpl(const LTX2AudioConfig& config, const std::optional<LTX2VocoderConfig>& vocoder);

  AudioVaeModule vae{nullptr};
  Vocoder vocoder{nullptr};
};
TORCH_MODULE(LTX2AudioModule);

class LTX2AudioDecoder final : public ModuleDecoder<LTX2AudioModule> {
 public:
  // Default-initialised weights (the loader fills them).
  LTX2AudioDecoder(LTX2AudioConfig config, std::optional<LTX2VocoderConfig> vocoder, std::string config_json);

  // [B, C, L, M], or packed [B, L, C·M]; with a vocoder, the mel it makes must be the vocoder's input width.
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  absl::Status ValidateLatentFor(const at::Tensor& latent, const DecodeConditioning& conditioning) const override;
  // The waveform's shape (the mel's without a vocoder).
  std::vector<int64_t> OutputShape(const std::vector<int64_t>& latent_shape) const override;
  std::vector<int64_t> OutputShapeFor(const std::vector<int64_t>& latent_shape,
                                      const DecodeConditioning& conditioning) const override;
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // [B, C, L, M]
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops, const DecodeConditioning& conditioning) override;

  const LTX2AudioConfig& config() const { return config_; }
  const std::optional<LTX2VocoderConfig>& vocoder_config() const { return vocoder_; }

 private:
  // A packed [B, L, C·M] latent as [B, C, L, M]; a 4-D one as it is.
  at::Tensor Unpacked(const at::Tensor& latent) const;
  int64_t MelBins(int64_t latent_bins) const;

  LTX2AudioConfig config_;
  std::optional<LTX2VocoderConfig> vocoder_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::ltx2_audio
