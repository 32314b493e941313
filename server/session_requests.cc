#include "server/session_requests.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/status_macros.h"
#include "server/mode_selection.h"
#include "server/request_validation.h"

namespace vaedecode::server {
namespace {

int64_t DtypeBytes(v1::DType dtype) { return dtype == v1::FLOAT32 ? 4 : 2; }

// Dimensions a session's latent may have: positive, and small enough that
// their products cannot overflow before the Decode checks see them.
constexpr int64_t kMaxDimension = int64_t{1} << 20;
constexpr int64_t kMaxProbeElements = int64_t{1} << 31;
// The longest clip the open's admission probe grows to (a window's frames).
constexpr int64_t kMaxWindowProbe = 1024;

}  // namespace

v1::DecodeRequest SessionChunkRequest(const v1::SessionOpen& open, v1::Mode mode, int64_t index) {
  v1::DecodeRequest request;
  request.set_model(open.model());
  request.set_latent_space(open.latent_space());
  request.set_mode(mode);
  request.set_output_format(open.output_format());
  request.set_request_id(absl::StrCat(open.session_id(), "/", index));
  request.set_jpeg_quality(open.jpeg_quality());
  if (open.has_png_compression()) request.set_png_compression(open.png_compression());
  if (open.has_scaling_factor()) request.set_scaling_factor(open.scaling_factor());
  if (open.has_shift_factor()) request.set_shift_factor(open.shift_factor());
  return request;
}

absl::StatusOr<SessionPlan> ValidateSessionOpen(const v1::SessionOpen& open, const v1::ModelInfo& model, int group_size,
                                                const AdmissionLimits& limits, int64_t max_chunk_bytes) {
  if (!model.streams()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model \"", model.name(), "\" cannot be decoded in a session: ", model.streams_note()));
  }
  if (open.shape_size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("shape: the latent's shape without its frames is [B, C, H, W]; got ",
                                                   open.shape_size(), " dimensions"));
  }
  for (int64_t d : open.shape()) {
    if (d < 1 || d > kMaxDimension) {
      return absl::InvalidArgumentError(absl::StrCat("shape: dimensions must be 1..", kMaxDimension, "; got [",
                                                     absl::StrJoin(open.shape(), ", "), "]"));
    }
  }
  if (open.output_format() == v1::OUTPUT_MP4) {
    return absl::InvalidArgumentError(
        "output_format: OUTPUT_MP4 needs the clip's end; a session streams tensors, uint8, PNG or JPEG frames");
  }
  if (open.mode() == v1::MODE_TILED) {
    return absl::InvalidArgumentError("mode: a session decodes dense or exact (its state is not tiled)");
  }
  if (open.idle_timeout_ms() < 0) return absl::InvalidArgumentError("idle_timeout_ms: must not be negative");
  // Everything else as a one-frame Decode of the same latent is checked.
  v1::DecodeRequest probe = SessionChunkRequest(open, open.mode(), 0);
  v1::Tensor* latent = probe.mutable_latent();
  latent->set_dtype(open.latent_dtype());
  for (int64_t d : {open.shape(0), open.shape(1), int64_t{1}, open.shape(2), open.shape(3)}) latent->add_shape(d);
  int64_t elements = 1;
  for (int64_t d : open.shape()) {
    if (elements > kMaxProbeElements / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape: [", absl::StrJoin(open.shape(), ", "), "] is too large for one latent frame"));
    }
    elements *= d;
  }
  const int64_t frame_bytes = elements * DtypeBytes(open.latent_dtype());
  if (frame_bytes > max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("shape: one latent frame of [", absl::StrJoin(open.shape(), ", "),
                                                     "] is ", frame_bytes, " bytes, more than a chunk may carry (",
                                                     max_chunk_bytes, ", --max_message_bytes)"));
  }
  latent->mutable_data()->resize(static_cast<size_t>(frame_bytes));
  RETURN_IF_ERROR(ValidateDecodeRequest(probe, model));
  // A chunk of one latent frame may decode as many latent frames as a
  // decode holds at once (MiniMax-H3: a window, once its latents have come)
  // and return session_chunk_frames frames (a window's; 4 of a causal
  // decoder with temporal factor 4): the session is admitted for the
  // shortest clip that covers both.
  v1::DecodeRequest window_probe = probe;
  window_probe.mutable_latent()->set_shape(2, std::max<int64_t>(1, model.peak_latent_frames()));
  for (int64_t t = window_probe.latent().shape(2);
       t < kMaxWindowProbe && PredictOutputSize(window_probe, model).frames < model.session_chunk_frames(); ++t) {
    window_probe.mutable_latent()->set_shape(2, t + 1);
  }
  RETURN_IF_ERROR(CheckAdmission(window_probe, model, limits));

  SessionPlan plan;
  const bool shards = std::count(model.supported_modes().begin(), model.supported_modes().end(), v1::MODE_EXACT) > 0;
  if (open.mode() == v1::MODE_EXACT && (!shards || group_size < 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: MODE_EXACT needs a group of more than one rank and a model that shards (model \"",
                     model.name(), "\", groups of ", group_size, ")"));
  }
  if (open.mode() == v1::MODE_EXACT || (open.mode() == v1::MODE_AUTO && shards && group_size > 1)) {
    plan.mode = v1::MODE_EXACT;
    plan.mode_reason = open.mode() == v1::MODE_AUTO ? "auto: exact over the group" : "requested";
  } else {
    plan.mode = v1::MODE_DENSE;
    plan.mode_reason =
        open.mode() == v1::MODE_AUTO ? "auto: dense (one rank, or the model does not shard)" : "requested";
  }
  const double area = static_cast<double>(open.shape(0) * open.shape(2) * open.shape(3));
  const int64_t ranks = plan.mode == v1::MODE_EXACT ? group_size : 1;
  plan.state_bytes_per_rank = static_cast<int64_t>(model.session_state_bytes_per_latent() * area / ranks);
  const PeakEstimates peaks = EstimatePeaks(window_probe, model, group_size);
  plan.chunk_peak_bytes = plan.mode == v1::MODE_EXACT ? peaks.exact_rank : peaks.dense;
  return plan;
}

absl::Status ValidateSessionChunk(const v1::SessionOpen& open, const v1::Tensor& chunk) {
  const bool fits = open.shape_size() == 4 && chunk.shape_size() == 5 && chunk.dtype() == open.latent_dtype() &&
                    chunk.shape(0) == open.shape(0) && chunk.shape(1) == open.shape(1) && chunk.shape(2) >= 1 &&
                    chunk.shape(3) == open.shape(2) && chunk.shape(4) == open.shape(3);
  if (fits) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "chunk: a session's chunks are [",
      absl::StrJoin(open.shape().begin(), open.shape().begin() + std::min(2, open.shape_size()), ", "), ", t, ",
      absl::StrJoin(open.shape().begin() + std::min(2, open.shape_size()), open.shape().end(), ", "), "] ",
      v1::DType_IsValid(open.latent_dtype()) ? v1::DType_Name(open.latent_dtype()) : "?", " with t >= 1; got [",
      absl::StrJoin(chunk.shape(), ", "), "] ",
      v1::DType_IsValid(chunk.dtype()) ? v1::DType_Name(chunk.dtype()) : "?"));
}

}  // namespace vaedecode::server
