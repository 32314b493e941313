#pragma once

// Between the public API's messages (proto/vaedecode/v1) and the worker's
// types, for the leader's service and the CLI alike: a loaded model's
// ModelInfo, a request's latent as a tensor, a request's decode inputs.

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "tiling/calibration.h"
#include "vaedecode/v1/vaedecode.pb.h"
#include "worker/decode_job.h"
#include "worker/encode_job.h"
#include "worker/model_repository.h"

namespace vaedecode::worker {

// `m`'s ModelInfo as a group of `world_size` ranks serves it, with its
// measured peaks (`profile`; zeros when not calibrated) and session state
// (MeasureSessionStateBytesPerLatent).
void DescribeModel(const NamedModel& m, const tiling::PeakProfile& profile, int world_size, v1::ModelInfo* out,
                   double session_state_bytes_per_latent = 0);

// The latent of a request as a CPU tensor, or INVALID_ARGUMENT naming what
// is wrong (rpc/latent_tensor.h, the checks the server ran before).
absl::StatusOr<at::Tensor> LatentFromRequest(const v1::Tensor& latent);

// An encode request's image as the encoder takes it (a float CPU tensor
// [B, C, (T,) H, W] in [-1, 1]): a float tensor as it is, UINT8 pixels
// [B, (T,) H, W, C] and PNG / JPEG bytes as diffusers' VaeImageProcessor
// preprocesses them (p / 255 * 2 - 1); INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<at::Tensor> ImageFromRequest(const v1::EncodeRequest& request);

// The request's encode options with `image`.
EncodeJob EncodeJobFromRequest(const v1::EncodeRequest& request, at::Tensor image);

// The request's decode inputs beside the latent (its space, timestep,
// scaling overrides, decode noise), with `latent`.
DecodeJob JobFromRequest(const v1::DecodeRequest& request, at::Tensor latent);

}  // namespace vaedecode::worker
