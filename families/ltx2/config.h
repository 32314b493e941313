#pragma once

// Constructor arguments of diffusers' AutoencoderKLLTX2Video (LTX-2's video
// VAE, autoencoders/autoencoder_kl_ltx2.py) that shape its decoder and its
// encoder, with diffusers' defaults. The decoder's per-block lists are as in
// config.json (listed from the output side; the decoder reverses them, except
// upsample_type); the encoder's are in encode order.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "families/layer_ops.h"

namespace vaedecode::families::ltx2 {

// One decoder up block, in decode order, as LTX2VideoDecoder3d builds it.
struct UpBlockSpec {
  int64_t in_channels = 0;   // input_channel: a conv_in resnet when != out_channels
  int64_t out_channels = 0;  // width of its resnets
  int64_t num_layers = 0;
  bool upsample = false;        // spatio_temporal_scale
  std::vector<int64_t> stride;  // (t, h, w) of the depth-to-space upsampler
  bool upsample_residual = false;
  int64_t upscale_factor = 1;
};

// One encoder down block, in encode order, as LTX2VideoEncoder3d builds it.
struct DownBlockSpec {
  int64_t in_channels = 0;   // width of its resnets
  int64_t out_channels = 0;  // after its downsampler (in_channels without one, or for "conv")
  int64_t num_layers = 0;
  // "" without a downsampler (spatio_temporal_scaling false), else "conv",
  // "spatial", "temporal" or "spatiotemporal".
  std::string downsample_type;
  std::vector<int64_t> stride;  // (t, h, w) of the downsampler; {1, 1, 1} without one
};

struct LTX2Config {
  int64_t latent_channels = 128;
  int64_t out_channels = 3;
  std::vector<int64_t> decoder_block_out_channels = {256, 512, 1024};
  std::vector<int64_t> decoder_layers_per_block = {5, 5, 5, 5};
  std::vector<bool> decoder_spatio_temporal_scaling = {true, true, true};
  std::vector<bool> decoder_inject_noise = {false, false, false, false};
  std::vector<std::string> upsample_type = {"spatiotemporal", "spatiotemporal", "spatiotemporal"};
  std::vector<bool> upsample_residual = {true, true, true};
  std::vector<int64_t> upsample_factor = {2, 2, 2};
  bool timestep_conditioning = false;
  int64_t patch_size = 4;
  int64_t patch_size_t = 1;
  double resnet_norm_eps = 1e-6;
  double scaling_factor = 1.0;
  bool decoder_causal = true;  // the constructor's default; released configs set false
  PaddingMode spatial_padding = PaddingMode::kReflect;
  std::string spatial_padding_name = "reflect";
  // The encoder side (read always, checked by CheckEncoder when it is built).
  int64_t in_channels = 3;
  std::vector<int64_t> block_out_channels = {256, 512, 1024, 2048};
  std::vector<int64_t> layers_per_block = {4, 6, 6, 2, 2};
  std::vector<std::string> down_block_types = {"LTX2VideoDownBlock3D", "LTX2VideoDownBlock3D", "LTX2VideoDownBlock3D",
                                               "LTX2VideoDownBlock3D"};
  std::vector<std::string> downsample_type = {"spatial", "temporal", "spatiotemporal", "spatiotemporal"};
  std::vector<bool> spatio_temporal_scaling = {true, true, true, true};
  bool encoder_causal = true;
  std::string encoder_spatial_padding_name = "zeros";
  PaddingMode encoder_spatial_padding = PaddingMode::kZeros;  // when the name is supported

  // The decoder as LTX2VideoDecoder3d builds it from the lists above.
  int64_t mid_channels() const;  // conv_in / mid block width
  int64_t mid_layers() const;
  std::vector<UpBlockSpec> UpBlocks() const;
  int64_t final_channels() const;  // norm_out / conv_out input width

  // Output pixels per latent row and frames per latent frame after the first.
  int64_t spatial_factor() const;
  int64_t temporal_factor() const;

  // The encoder as LTX2VideoEncoder3d builds it (CheckEncoder first).
  std::vector<DownBlockSpec> DownBlocks() const;
  int64_t encoder_mid_channels() const;  // the mid block's and conv_out's input width
  // OK when diffusers builds and runs this encoder; why not otherwise
  // (widths that do not chain, unknown block or downsample types, lists too
  // short, a padding mode the row-sharded convs do not support).
  absl::Status CheckEncoder() const;

  // Parses and validates (`source` names the file in errors): lists of the
  // right lengths (bools broadcast as diffusers does), no inject_noise, a
  // padding mode the row-sharded convs support.
  // Config keys this decoder neither reads nor knows (ConfigReader::UnreadKeys).
  std::vector<std::string> unread_keys;
  // Structure keys that disagree with the blocks (ModelInfo::config_warnings).
  std::vector<std::string> structure_warnings;

  static absl::StatusOr<LTX2Config> FromJson(const nlohmann::json& config, const std::string& source);
};

}  // namespace vaedecode::families::ltx2
