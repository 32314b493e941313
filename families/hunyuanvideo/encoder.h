#pragma once

// HunyuanVideo's encode side: diffusers' AutoencoderKLHunyuanVideo `_encode`
// as `vae.encode(x)` runs it by default: HunyuanVideoEncoder3D and
// quant_conv on the whole clip up to tile_sample_min_num_frames (16)
// frames, and beyond that diffusers' temporal tiling (use_framewise_encoding
// is on by default): windows of 17 frames every 12, later windows without
// their first latent frame, each window's first latent frame replaced by the
// previous window's last (blend_t over 16/4 - 12/4 = 1 frame), cut to
// (T - 1) / 4 + 1 latent frames. Its downsamplers round up (ceil(rows / 2)),
// so any size encodes. Exact sharding: families/hunyuanvideo/blocks.h.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "families/encoder.h"
#include "families/hunyuanvideo/blocks.h"
#include "families/hunyuanvideo/config.h"
#include "families/model_files.h"
#include "families/registry.h"

namespace vaedecode::families::hunyuanvideo {

// The encode-side parameters of AutoencoderKLHunyuanVideo: encoder.*, quant_conv.*.
class HunyuanVideoEncodeModuleImpl : public torch::nn::Module {
 public:
  explicit HunyuanVideoEncodeModuleImpl(const HunyuanVideoConfig& config);
  // diffusers _encode (T <= 16 frames) or _temporal_tiled_encode.
  at::Tensor Encode(const at::Tensor& x, LayerOps& ops);
  // The encoder and quant_conv on all of x's frames (one temporal tile).
  at::Tensor EncodeWhole(const at::Tensor& x, LayerOps& ops);

  HunyuanVideoEncoder3D encoder{nullptr};
  torch::nn::Conv3d quant_conv{nullptr};  // 1x1x1

 private:
  HunyuanVideoConfig config_;
};
TORCH_MODULE(HunyuanVideoEncodeModule);

class HunyuanVideoEncoder final : public ModuleBackedEncoder {
 public:
  using Config = HunyuanVideoConfig;
  // Throws StatusError for a config diffusers cannot encode with (CheckEncoder).
  explicit HunyuanVideoEncoder(HunyuanVideoConfig config);

  std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const override;
  at::Tensor Moments(const at::Tensor& image, LayerOps& ops) override;
  at::Tensor ToRawSpace(const at::Tensor& latent) const override;  // z * scaling_factor
  std::vector<RowLevel> RowLevels(int64_t input_rows) const override;
  torch::nn::Module& parameters_module() override { return *module_; }

 private:
  HunyuanVideoConfig config_;
  HunyuanVideoEncodeModule module_;
};

absl::StatusOr<std::unique_ptr<Encoder>> LoadHunyuanVideoEncoder(const ModelFiles& files, const LoadOptions& options);

}  // namespace vaedecode::families::hunyuanvideo
