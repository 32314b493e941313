#pragma once

// What AutoencoderKLFlux2 adds to AutoencoderKL's decoder (whose blocks are
// reused from families/autoencoder_kl/blocks.h): the latent BatchNorm's
// running statistics and Flux2Pipeline's 2x2 patch conversion.
//
// Both are row-local: the statistics are per channel, and each denoiser-side
// latent row becomes `patch_h` VAE-side rows, so a row band of a raw latent
// converts to the matching band of the VAE latent (ShardedLayerOps then sees every
// layer's rows scaled uniformly by patch_h).
//
// How AutoencoderKLFlux2 shards by rows (exact mode): its decoder is
// AutoencoderKL's, so every layer shards as autoencoder_kl/blocks.h says
// (halo convs of radius <= 1, merged GroupNorm statistics, all-gathered K/V
// in the mid block; the only condition is >= 1 latent row per band).
//
// A `raw` latent is unpacked (BatchNorm de-normalisation, 2x2 unpatchify)
// once, on the leader, before it is sharded (worker/decode_plan.h): the
// bands are cut from the VAE-space latent, 2h rows for h raw rows.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace vaedecode::families::flux2 {

// diffusers' `bn` (nn.BatchNorm2d(affine=False, track_running_stats=True)) as
// the pipeline uses it: only its running statistics. num_batches_tracked
// (I64, training only) is not mirrored; the loader ignores it by name.
class LatentBatchNormImpl : public torch::nn::Module {
 public:
  explicit LatentBatchNormImpl(int64_t channels);

  // Flux2Pipeline's de-normalisation: z * sqrt(running_var + eps) + running_mean,
  // per channel of a [B, C·ph·pw, h, w] latent, in z's dtype.
  at::Tensor Denormalize(const at::Tensor& z, double eps) const;
  // The inverse, as Flux2Pipeline._encode_vae_image: (x - mean) / std.
  at::Tensor Normalize(const at::Tensor& x, double eps) const;

  at::Tensor running_mean;  // [C·ph·pw]
  at::Tensor running_var;   // [C·ph·pw]
};
TORCH_MODULE(LatentBatchNorm);

// Flux2Pipeline._unpatchify_latents: [B, C·ph·pw, h, w] -> [B, C, h·ph, w·pw];
// VAE pixel (c, y·ph + dy, x·pw + dx) comes from channel c·ph·pw + dy·pw + dx.
at::Tensor UnpatchifyLatents(const at::Tensor& x, int64_t patch_h, int64_t patch_w);

// Flux2Pipeline._patchify_latents, the inverse: [B, C, H, W] -> [B, C·ph·pw, H/ph, W/pw].
at::Tensor PatchifyLatents(const at::Tensor& x, int64_t patch_h, int64_t patch_w);

}  // namespace vaedecode::families::flux2
