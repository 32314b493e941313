#include "worker/encode_job.h"

#include <random>

#include <ATen/ATen.h>

#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {

namespace {

// A 4-D image (a PNG or JPEG decodes to [1, C, H, W]) is one frame for a
// video encoder, as the I2V and edit pipelines feed a still image.
at::Tensor AsEncoderInput(const families::Encoder& encoder, const at::Tensor& image) {
  return encoder.info().is_video && image.dim() == 4 ? image.unsqueeze(2) : image;
}

}  // namespace

absl::Status CheckEncodeJob(const families::Encoder& encoder, const EncodeJob& job) {
  const at::Tensor image = AsEncoderInput(encoder, job.image);
  RETURN_IF_ERROR(encoder.ValidateImage(image));
  if (job.posterior == families::PosteriorOutput::kMoments && job.latent_space == families::LatentSpace::kRaw) {
    return absl::InvalidArgumentError(
        "posterior \"moments\" is returned in VAE space only: ask for latent_space vae, or for the mean or a sample "
        "in raw space");
  }
  if (job.latent_space == families::LatentSpace::kRaw) {
    RETURN_IF_ERROR(encoder.CheckRawLatentShape(encoder.LatentShape(image.sizes().vec())));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> PrepareImage(const families::Encoder& encoder, const EncodeJob& job) {
  RETURN_IF_ERROR(CheckEncodeJob(encoder, job));
  at::Tensor image;
  RETURN_IF_ERROR(families::CatchExceptions("image conversion", [&] {
    image = AsEncoderInput(encoder, job.image).to(encoder.device());
    if (job.from_pixels) image = encoder.info().pixels.FromSymmetric(image);
    image = image.to(encoder.dtype()).contiguous();
  }));
  return image;
}

absl::StatusOr<at::Tensor> EncodePrepared(families::Encoder& encoder, const at::Tensor& image,
                                          families::LayerOps& ops) {
  at::Tensor moments;
  RETURN_IF_ERROR(families::CatchExceptions("encode", [&] { moments = encoder.Moments(image, ops); }));
  return moments;
}

absl::StatusOr<EncodeResult> FinishEncode(const families::Encoder& encoder, const at::Tensor& moments,
                                          const EncodeJob& job) {
  EncodeResult out;
  RETURN_IF_ERROR(families::CatchExceptions("posterior", [&] {
    // In float32, as diffusers' float32 pipelines compute it; the moments
    // of a bfloat16 encode are widened first.
    const families::Posterior posterior = families::SplitMoments(moments.to(at::kCPU).to(at::kFloat));
    switch (job.posterior) {
      case families::PosteriorOutput::kMoments:
        out.mean = posterior.mean.contiguous();
        out.logvar = posterior.logvar.contiguous();
        return;
      case families::PosteriorOutput::kSample:
        out.seed = job.seed ? *job.seed : std::random_device{}();
        out.latent = families::SamplePosterior(posterior, *out.seed);
        break;
      case families::PosteriorOutput::kMean:
        out.latent = posterior.mean;
        break;
    }
    if (job.latent_space == families::LatentSpace::kRaw) out.latent = encoder.ToRawSpace(out.latent);
    out.latent = out.latent.contiguous();
  }));
  return out;
}

absl::StatusOr<EncodeResult> RunEncode(families::Encoder& encoder, const EncodeJob& job, families::LayerOps& ops) {
  ASSIGN_OR_RETURN(at::Tensor image, PrepareImage(encoder, job));
  ASSIGN_OR_RETURN(at::Tensor moments, EncodePrepared(encoder, image, ops));
  return FinishEncode(encoder, moments, job);
}

}  // namespace vaedecode::worker
