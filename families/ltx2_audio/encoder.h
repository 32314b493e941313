#pragma once

// LTX-2 audio's encode side: AutoencoderKLLTX2Audio.encode of a stereo mel
// spectrogram [B, in_channels, frames, mel_bins] to its posterior
// [B, latent_channels, L, M] (L = 1 + (frames - 1) // 4 for the causal
// height axis: frames past 1 + 4k touch only the last latent frame). `raw`
// is what LTX2Pipeline.prepare_audio_latents makes of a caller's latent:
// packed [B, L, C·M], (x - latents_mean) / latents_std. Encoded densely in
// float32 on one process, like the decode.

#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/ltx2_audio/blocks.h"
#include "families/ltx2_audio/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::ltx2_audio {

// The encode-side state dict: encoder.*, latents_mean, latents_std.
class AudioEncodeModuleImpl : public torch::nn::Module {
 public:
  explicit AudioEncodeModuleImpl(const LTX2AudioConfig& config);

  AudioEncoder encoder{nullptr};
  at::Tensor latents_mean, latents_std;
};
TORCH_MODULE(AudioEncodeModule);

class LTX2AudioEncoder final : public ModuleBackedEncoder {
 public:
  using Config = LTX2AudioConfig;
  explicit LTX2AudioEncoder(LTX2AudioConfig config);

  // [B, in_channels, frames, mel_bins], each side long enough for every downsampler.
  absl::Status ValidateImage(const at::Tensor& image) const override;
  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;  // packed, (x - mean) / std
  absl::Status CheckRawLatentShape(const std::vector<int64_t>& latent_shape) const override;
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  // The sizes of frames (dim 2) or mel bins (dim 3) after each level: input first.
  std::vector<int64_t> Sizes(int64_t input, int dim) const;

  LTX2AudioConfig config_;
  AudioEncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadLTX2AudioEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::ltx2_audio
