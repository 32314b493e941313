#pragma once

// The MiniMax-H3 video family: diffusers' AutoencoderKLMiniMaxH3 decode path,
// a ViT decoder over temporal windows: the latent is padded with copies of
// its last frame, windows of tokens_chunk_size + token_overlap latent frames
// (7 in the release) every tokens_chunk_size (5) are each decoded whole
// (post_quant_conv, then the ViT over every token of the window), the first
// frame_pre_padding frames of each chunk dropped, consecutive windows
// cross-faded over frame_overlap frames, and the pad's frames cut.
//
// diffusers turns spatial tiling on by default for this class (256-pixel
// tiles, linear blend); this family decodes untiled (exact), as the fixtures
// were made (`disable_tiling()`). Both agree up to 256x256-pixel frames;
// above that the released pipeline's output is the blended-tile one. TILED
// mode is refused for it. Fewer than 3 latent frames (no window: diffusers
// fails) are refused. `raw` latents are de-normalised as the
// MiniMaxH3VideoDecodeStep does: z * latents_std + latents_mean.
//
// It streams (sessions) through the same windows: a window is decoded once
// its latent frames have come, its frames returned once no later window
// fades into them or the clip's end cuts them (StreamedFrames); the last
// window and overlap wait for the clip's end (DecodeChunk's clip_ends).

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include "families/minimax_h3/blocks.h"
#include "families/minimax_h3/config.h"
#include "families/module_decoder.h"
#include "families/registry.h"

namespace vaedecode::families::minimax_h3 {

// The decode-side parameters of AutoencoderKLMiniMaxH3: decoder.*, post_quant_conv.*.
class MiniMaxH3ModuleImpl : public torch::nn::Module {
 public:
  explicit MiniMaxH3ModuleImpl(const MiniMaxH3Config& config);
  // diffusers _decode_clip with tiling off: one window.
  at::Tensor DecodeWindow(const at::Tensor& z, LayerOps& ops);

  ViTDecoder decoder{nullptr};
  torch::nn::Conv3d post_quant_conv{nullptr};  // 1x1x1
};
TORCH_MODULE(MiniMaxH3Module);

class MiniMaxH3Decoder final : public ModuleDecoder<MiniMaxH3Module> {
 public:
  using Config = MiniMaxH3Config;
  // A decoder with default-initialised weights (callers load or fill them).
  MiniMaxH3Decoder(MiniMaxH3Config config, std::string config_json);

  // The base checks, and at least one window's worth of latent frames.
  absl::Status ValidateLatent(const at::Tensor& latent) const override;
  // The base checks: a chunk of a clip may be shorter than a window.
  absl::Status ValidateChunk(const at::Tensor& latent) const override;
  // At least one window's worth of latent frames (info().min_latent_frames).
  absl::Status CheckClipLength(int64_t latent_frames) const;
  at::Tensor ToVaeSpace(const at::Tensor& raw) const override;  // z * latents_std + latents_mean
  // One chunk of a fresh stream: the windows are decoded as a stream decodes them.
  at::Tensor Decode(const at::Tensor& z, LayerOps& ops) override;
  // Streams: each window is decoded once its latent frames have come, and
  // its frames returned once no later window fades into them; the last
  // window and overlap wait for the clip's end (stream_holds_clip_end).
  absl::Status CheckStreaming() const override;
  using Decoder::OpenStream;
  std::unique_ptr<DecodeStream> OpenStream(const DecodeConditioning& conditioning) override;
  int64_t StreamedFrames(int64_t latent_frames, bool clip_ended) const override;

  const MiniMaxH3Config& config() const { return config_; }

 private:
  // diffusers' _keep_in_fp32_modules on the decoder side: the RMS/Layer
  // norms and the residual scales stay float32 (and with them the residual
  // stream), the projections take the decode dtype.
  void ConvertWeights(at::ScalarType dtype) override;

  MiniMaxH3Config config_;
};

void Register(Registry& registry);

}  // namespace vaedecode::families::minimax_h3
