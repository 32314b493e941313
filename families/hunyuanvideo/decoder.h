#pragma once

// The HunyuanVideo family: diffusers' AutoencoderKLHunyuanVideo decode path
// as `vae.decode(z)` runs it by default: post_quant_conv and
// HunyuanVideoDecoder3D on the whole latent up to 4 latent frames
// (tile_sample_min_num_frames / temporal_compression_ratio), and beyond that
// diffusers' temporal tiling (use_framewise_decoding is on by default):
// windows of 5 latent frames every 3, each decoded whole, later windows
// without their first frame, overlaps blended linearly over 4 frames.
// `raw` latents are de-normalised as the pipeline does: z / scaling_factor.

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "absl/status/statusor.h"
#include "families/decoder.h"
#include "families/hunyuanvideo/blocks.h"
#include "families/hunyuanvideo/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanvideo {

// The decode-side parameters of AutoencoderKLHunyuanVideo, named as in its
// state dict: decoder.*, post_quant_conv.*.
class AutoencoderKLHunyuanVideoModuleImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLHunyuanVideoModuleImpl(const HunyuanVideoConfig& config);
  // diffusers _decode (T <= tile_latent_min_frames) or _temporal_tiled_decode.
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops);  // [B, C, T, h, w] -> [B, 3, 1 + 4(T-1), 8h, 8w]
  // post_quant_conv and the decoder on all of z's frames (one temporal tile).
  at::Tensor DecodeWhole(const at::Tensor& z, LayerOps& ops);

  HunyuanVideoDecoder3D decoder{nullptr};
  torch::nn::Conv3d post_quant_conv{nullptr};  // 1x1x1

 private:
  HunyuanVideoConfig config_;
};
TORCH_MODULE(AutoencoderKLHunyuanVideoModule);

class HunyuanVideoDecoder final : public ModuleDecoder<AutoencoderKLHunyuanVideoModule> {
 public:
  using Config = HunyuanVideoConfig;
  // A decoder with default-initialised weights (callers load or fill them).
  HunyuanVideoDecoder(HunyuanVideoConfig config, std::string config_json);

  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z / scaling_factor
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  // Refused: the GroupNorms take statistics over every frame of the clip.
  absl::Status CheckStreaming() const override;

  const HunyuanVideoConfig& config() const { return config_; }

 private:
  HunyuanVideoConfig config_;
};

// Loads an AutoencoderKLHunyuanVideo from diffusers files (encoder.* and
// quant_conv.* ignored by name).
absl::StatusOr<std::unique_ptr<Decoder>> LoadHunyuanVideo(const ModelFiles& files, const LoadOptions& options);

void Register(Registry& registry);

}  // namespace vaedecode::families::hunyuanvideo
