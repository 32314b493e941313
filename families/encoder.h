#pragma once

// What every family encoder offers: identity and geometry of the encode
// side, the encode itself through LayerOps (so it runs dense or as a row
// band, like the decoders), the row levels exact sharding cuts bands at, and
// the pipeline's normalisation of a VAE latent for the denoiser (`raw`).
//
// The encode side is its own object: a model served only for decoding never
// loads the encoder's weights (Registry::LoadEncoder reads them on demand).
//
// Threading: not thread-safe; one job at a time per instance.
// Errors: Moments and ToRawSpace run LibTorch ops and may throw c10::Error;
// callers turn them into absl::Status (families/status_error.h).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "families/layer_ops.h"
#include "families/pixel_convention.h"
#include "parallel/band_partition.h"

namespace torch::nn {
class Module;
}

namespace vaedecode::families {

struct EncoderInfo {
  std::string family;           // registry name, e.g. "autoencoder_kl"
  std::string diffusers_class;  // config "_class_name"
  int64_t in_channels = 3;      // image channels (4 for RGBA VAEs)
  int64_t latent_channels = 0;  // of the posterior's mean
  int64_t spatial_factor = 1;   // input pixels per latent row/column
  int64_t temporal_factor = 1;  // 1 for image families
  bool is_video = false;        // images are NCTHW when true, NCHW otherwise
  // Each downsampler floors (AutoencoderKL: any size encodes, 100 rows →
  // 12 at 8x) rather than requiring multiples of spatial_factor.
  bool floors_sizes = true;
  int64_t parameter_count = 0;  // encoder-side parameters
  // It encodes in float32 whatever dtype the model is served in: diffusers
  // pins it there (_keep_in_fp32_modules), or it is an audio VAE, which
  // vaedecode always runs in float32.
  bool computes_in_float32 = false;
  // An audio VAE's (a waveform or mel spectrogram in): encoded densely on
  // one process, so exact sharding is refused.
  bool is_audio = false;
  // What 8-bit pixels become (MiniMax-H3: ImageNet-normalised).
  PixelConvention pixels;
  // 0, or: a clip of more than one frame is padded to whole clips of this
  // many frames, encoded one after another (MiniMax-H3), so its memory is
  // one clip's whatever its length.
  int64_t clip_frames = 0;
  // How a VAE latent becomes the denoiser's (`raw`), for humans.
  std::string vae_to_raw_formula;
};

// One resolution an encode's activations pass through: its rows, and how
// many of them one latent row covers (the last band takes the remainder:
// `rows` need not be a multiple).
struct RowLevel {
  int64_t rows = 0;
  int64_t per_latent_row = 1;
};

// The layouts of `levels` on `rank` of `world_size` (axis 0): the latent
// rows split by PartitionRows, every level's band that many latent rows
// times per_latent_row, the last band running to the level's end.
std::vector<parallel::ShardSpec> RowLevelSpecs(const std::vector<RowLevel>& levels, int rank, int world_size);

// Each level's rows of an `rows`-row input through `downsamplers` layers
// that pad one row below and apply a 3x3 stride-2 conv (diffusers'
// Downsample2D, WanResample's downsamplers): each floors.
std::vector<RowLevel> DownsampledRowLevels(int64_t rows, int64_t downsamplers);

// The levels of an encode whose levels have `rows` rows (input first, each
// distinct), level i covering `ratios[i]` times level i+1's rows per latent
// row (one ratio fewer than levels; 2 for a downsampler, the patch size for
// a patchify).
std::vector<RowLevel> RowLevelsOfRows(const std::vector<int64_t>& rows, const std::vector<int64_t>& ratios);

// The same for downsamplers that fold 2 rows into one exactly (space-to-
// depth: the Hunyuan families), `rows` a multiple of 2^downsamplers.
std::vector<RowLevel> HalvedRowLevels(int64_t rows, int64_t downsamplers);

class Encoder {
 public:
  virtual ~Encoder() = default;

  virtual const EncoderInfo& info() const = 0;

  // Checks rank, channels, dtype and sizes of an image (or clip) for this
  // model; sizes the class cannot encode are refused with its rule named.
  virtual absl::Status ValidateImage(const at::Tensor& image) const;

  // The posterior mean's shape for an image shape.
  virtual std::vector<int64_t> LatentShape(const std::vector<int64_t>& image_shape) const = 0;

  // vae.encode(x).latent_dist's parameters before DiagonalGaussian's clamp:
  // [B, 2·C, ...], mean then log-variance; the image in the encoder's dtype.
  virtual at::Tensor Moments(const at::Tensor& image, LayerOps& ops) = 0;

  // The family pipeline's normalisation of a VAE-space latent (mean or
  // sample) into the denoiser's space: the inverse of Decoder::ToVaeSpace.
  virtual at::Tensor ToRawSpace(const at::Tensor& latent) const = 0;
  // OK when a latent of this shape has a raw form (FLUX.2 packs 2x2 patches:
  // even sides only); why not otherwise, before anything is encoded.
  virtual absl::Status CheckRawLatentShape(const std::vector<int64_t>& latent_shape) const {
    (void)latent_shape;
    return absl::OkStatus();
  }

  // Every row level of an encode of `input_rows` rows, input first, latent
  // last, each distinct (exact sharding cuts bands at these).
  virtual std::vector<RowLevel> RowLevels(int64_t input_rows) const = 0;

  // OK when an image of this shape can be encoded exactly sharded over
  // `world_size` row bands (every band keeps a latent row, and no band has
  // the same rows at two levels); otherwise why not.
  virtual absl::Status CheckExactSharding(const std::vector<int64_t>& image_shape, int world_size) const;

  virtual void ToDtype(at::ScalarType dtype) = 0;
  virtual at::ScalarType dtype() const = 0;
  virtual void ToDevice(const c10::Device& device) = 0;
  virtual c10::Device device() const = 0;
};

// An Encoder over a LibTorch module holding the encode-side parameters
// under diffusers' state-dict names (encoder.*, quant_conv.*).
class ModuleBackedEncoder : public Encoder {
 public:
  const EncoderInfo& info() const final { return info_; }
  void ToDtype(at::ScalarType dtype) final;
  at::ScalarType dtype() const final { return dtype_; }
  void ToDevice(const c10::Device& device) final;
  c10::Device device() const final { return device_; }

  virtual torch::nn::Module& parameters_module() = 0;

 protected:
  explicit ModuleBackedEncoder(EncoderInfo info) : info_(std::move(info)) {}
  // Once the derived module exists: eval mode and the parameter count.
  void AdoptModule(torch::nn::Module& module);
  // Converts what computes in the encode dtype: the whole module, unless a
  // family keeps some parameters in float32 (FLUX.2's BatchNorm).
  virtual void ConvertWeights(at::ScalarType dtype);

  EncoderInfo info_;

 private:
  at::ScalarType dtype_ = at::kFloat;
  c10::Device device_ = c10::Device(c10::kCPU);
};

}  // namespace vaedecode::families
