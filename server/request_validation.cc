#include "server/request_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/image_bytes.h"
#include "formats/mp4.h"
#include "rpc/latent_tensor.h"
#include "rpc/output_assembler.h"
#include "rpc/output_formats.h"
#include "rpc/output_frames.h"
#include "rpc/request_checks.h"
#include "rpc/status_macros.h"

namespace vaedecode::server {
namespace {

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

int64_t AudioLatentFrames(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  const auto& shape = request.latent().shape();
  if (shape.size() == 4) return shape[2];  // [B, C, L, M]
  if (shape.size() != 3) return 0;
  return model.latent_bins() > 0 ? shape[1] : shape[2];  // packed [B, L, C·M], or [B, C, L]
}

int64_t AudioLatentBins(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  const auto& shape = request.latent().shape();
  if (model.latent_bins() == 0) return 0;
  if (shape.size() == 4) return shape[3];
  if (shape.size() == 3 && model.latent_channels() > 0) return shape[2] / model.latent_channels();
  return 0;
}

namespace {

// An audio VAE's latent: [B, C, L]; or [B, C, L, M] and, raw, the pipeline's
// packed [B, L, C·M] (the decoder checks the bins against its statistics
// and vocoder).
absl::Status ValidateAudioLatent(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  const v1::Tensor& latent = request.latent();
  const bool raw = request.latent_space() == v1::LATENT_SPACE_RAW;
  const int64_t c = model.latent_channels();
  if (model.latent_bins() == 0) {
    if (latent.shape_size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: model \"", model.name(),
                                                     "\" (an audio VAE) takes [B, C, L] latents, got ",
                                                     ShapeString(latent.shape())));
    }
    if (c > 0 && latent.shape(1) != c) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: model \"", model.name(), "\" takes ", c,
                                                     " latent channels, got ", latent.shape(1), " in ",
                                                     ShapeString(latent.shape())));
    }
    return absl::OkStatus();
  }
  if (latent.shape_size() == 4) {
    if (c > 0 && latent.shape(1) != c) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: model \"", model.name(), "\" takes ", c,
                                                     " latent channels, got ", latent.shape(1), " in ",
                                                     ShapeString(latent.shape())));
    }
    return absl::OkStatus();
  }
  if (latent.shape_size() == 3 && raw) {
    if (c > 0 && latent.shape(2) % c != 0) {
      return absl::InvalidArgumentError(absl::StrCat("latent.shape: a packed raw latent [B, L, C*M] for model \"",
                                                     model.name(), "\" has C*M a multiple of its ", c,
                                                     " latent channels; got ", ShapeString(latent.shape())));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "latent.shape: model \"", model.name(), "\" (an audio VAE) takes [B, C, L, M] latents",
      raw ? " or the pipeline's packed [B, L, C*M]" : " (the pipeline's packed [B, L, C*M] with latent_space RAW)",
      ", got ", ShapeString(latent.shape())));
}

}  // namespace

absl::Status ValidateDecodeRequest(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  RETURN_IF_ERROR(rpc::ValidateDecodeOptions(request, model));
  if (!request.has_latent()) return absl::InvalidArgumentError("latent: missing");
  const v1::Tensor& latent = request.latent();
  RETURN_IF_ERROR(rpc::CheckLatentDtype(latent));
  if (model.is_audio()) {
    ASSIGN_OR_RETURN(const int64_t numel, rpc::CountLatentElements(latent));
    RETURN_IF_ERROR(ValidateAudioLatent(request, model));
    RETURN_IF_ERROR(rpc::CheckLatentBytes(latent, numel));
    RETURN_IF_ERROR(rpc::ValidateOutputFormat(request, model));
    // A stream's header holds at most rpc::kMaxOutputDimension per dimension.
    if (const OutputSize out = PredictOutputSize(request, model); out.height > rpc::kMaxOutputDimension) {
      return absl::InvalidArgumentError(absl::StrCat(
          "latent.shape: ", ShapeString(latent.shape()), " decodes to about ", out.height,
          rpc::OutputKindOf(model, request) == rpc::OutputKind::kWaveform ? " samples" : " mel frames",
          " per channel, more than the ", rpc::kMaxOutputDimension, " an output dimension may hold; split the audio"));
    }
    return absl::OkStatus();
  }
  const int want_rank = model.is_video() ? 5 : 4;
  if (latent.shape_size() != want_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.shape: model \"", model.name(), "\" takes ", model.is_video() ? "[B, C, T, H, W]" : "[B, C, H, W]",
        " latents (rank ", want_rank, "), got rank ", latent.shape_size(), " ", ShapeString(latent.shape())));
  }
  ASSIGN_OR_RETURN(const int64_t numel, rpc::CountLatentElements(latent));
  const bool raw = request.latent_space() == v1::LATENT_SPACE_RAW;
  const int64_t channels =
      raw && model.raw_latent_channels() > 0 ? model.raw_latent_channels() : model.latent_channels();
  if (channels > 0 && latent.shape(1) != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.shape: model \"", model.name(), "\" takes ", channels, raw ? " raw" : "", " latent channels, got ",
        latent.shape(1), " in ", ShapeString(latent.shape()),
        !raw && latent.shape(1) == model.raw_latent_channels() ? " (a packed raw latent: send latent_space RAW)" : ""));
  }
  RETURN_IF_ERROR(rpc::CheckLatentBytes(latent, numel));
  return rpc::ValidateOutputFormat(request, model);
}

absl::Status ValidateMuxedAudio(const v1::DecodeRequest& request, const absl::StatusOr<v1::ModelInfo>& audio_model,
                                const AdmissionLimits& limits) {
  if (request.output_format() != v1::OUTPUT_MP4) {
    return absl::InvalidArgumentError(
        "audio_latent: an audio track is muxed into an MP4 (output_format MP4); decode it on its own otherwise");
  }
  if (request.audio_model().empty()) return absl::InvalidArgumentError("audio_model: empty; name the audio VAE");
  if (!request.has_audio_latent()) return absl::InvalidArgumentError("audio_latent: missing");
  if (!audio_model.ok()) {
    return absl::Status(audio_model.status().code(), absl::StrCat("audio_model: ", audio_model.status().message()));
  }
  if (!audio_model->is_audio() || audio_model->sample_rate() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("audio_model: \"", audio_model->name(), "\" is not ",
                     audio_model->is_audio() ? "an audio VAE with a vocoder (no waveform)" : "an audio VAE"));
  }
  if (!formats::IsAacSampleRate(audio_model->sample_rate()) || audio_model->out_channels() < 1 ||
      audio_model->out_channels() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "audio_model: \"", audio_model->name(), "\" makes ", audio_model->out_channels(), "-channel audio at ",
        audio_model->sample_rate(), " Hz; an MP4's AAC track takes mono or stereo at MPEG-4's rates"));
  }
  const v1::DecodeRequest audio = rpc::MuxedAudioRequest(request);
  if (absl::Status s = ValidateDecodeRequest(audio, *audio_model); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("audio_", s.message()));  // "audio_latent.shape: ..."
  }
  const int64_t audio_batch = request.audio_latent().shape(0), video_batch = request.latent().shape(0);
  const bool stereo_pairs = audio_model->out_channels() == 1 && audio_batch == 2 * video_batch;
  if (audio_batch != video_batch && !stereo_pairs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "audio_latent.shape: a batch of ", audio_batch, " beside the video latent's ", video_batch,
        audio_model->out_channels() == 1 ? absl::StrCat(" (a mono model's stereo: ", 2 * video_batch, ")") : ""));
  }
  if (absl::Status s = CheckAdmission(audio, *audio_model, limits); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("audio_", s.message()));
  }
  return absl::OkStatus();
}

OutputSize PredictOutputSize(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  OutputSize out;
  const auto& shape = request.latent().shape();
  if (model.is_audio()) {
    if (shape.size() < 3) return out;
    out.batch = shape[0];
    const int64_t frames = AudioLatentFrames(request, model);
    if (rpc::OutputKindOf(model, request) == rpc::OutputKind::kSpectrogram) {
      // [B, C, ~frames·f, mel_bins (or the latent's)] (f: mel frames per latent).
      out.height = frames * std::max<int64_t>(1, model.mel_frames_per_latent());
      out.width = model.mel_bins() > 0 ? model.mel_bins() : std::max<int64_t>(1, AudioLatentBins(request, model));
      return out;
    }
    // A waveform's samples as the rows of one column.
    out.height = frames * std::max<int64_t>(1, model.samples_per_latent());
    out.width = 1;
    return out;
  }
  if (shape.size() < 4) return out;
  const int64_t patch = request.latent_space() == v1::LATENT_SPACE_RAW && model.raw_patch() > 1 ? model.raw_patch() : 1;
  const int64_t f = std::max<int64_t>(1, model.spatial_factor());
  out.batch = shape[0];
  if (shape.size() == 5) {
    rpc::OutputFrameTable table;
    table.frames.assign(model.output_frame_table().begin(), model.output_frame_table().end());
    table.period = model.output_frame_period();
    table.frames_per_period = model.output_frames_per_period();
    out.frames = rpc::OutputFrames(table, model.temporal_factor(), shape[2]);
  }
  out.height = patch * shape[shape.size() - 2] * f;
  out.width = patch * shape[shape.size() - 1] * f;
  return out;
}

int64_t PredictTensorOutputBytes(const v1::DecodeRequest& request, const v1::ModelInfo& model) {
  const rpc::OutputFormatInfo* format = rpc::FindOutputFormat(request.output_format());
  if (format == nullptr || format->encoded) return 0;
  // At most 2^40 latent elements times a spatial factor² and a temporal
  // factor: far from int64's range.
  return PredictOutputSize(request, model).pixels() * std::max<int64_t>(1, model.out_channels()) *
         rpc::ElementSize(format->dtype);
}

absl::StatusOr<AdmissionLimits> ParseOutputPixelLimits(const std::string& flag) {
  AdmissionLimits limits;
  const auto bad = [&flag](absl::string_view piece, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--max_output_pixels=", flag, ": \"", piece, "\" ", why,
                                                   "; use N or N,MODEL=M,... (0: no limit)"));
  };
  bool first = true;
  for (absl::string_view piece : absl::StrSplit(flag, ',')) {
    std::string model;
    absl::string_view number = piece;
    if (const size_t eq = piece.find('='); eq != absl::string_view::npos) {
      model = std::string(piece.substr(0, eq));
      number = piece.substr(eq + 1);
      if (model.empty()) return bad(piece, "names no model");
    } else if (!first) {
      return bad(piece, "is a second default");
    }
    int64_t n = 0;
    if (!absl::SimpleAtoi(number, &n) || n < 0) return bad(piece, "is not a count of pixels");
    if (model.empty()) {
      limits.max_output_pixels = n;
    } else {
      limits.max_output_pixels_per_model[model] = n;
    }
    first = false;
  }
  return limits;
}

namespace {

// IEEE binary16 and bfloat16 from their bits, for the range checks.
bool HalfIsFinite(uint16_t h) { return (h & 0x7C00) != 0x7C00; }
bool Bf16IsFinite(uint16_t b) { return (b & 0x7F80) != 0x7F80; }
float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

struct ValueScan {
  int64_t non_finite = 0;
  int64_t overflow = 0;  // finite, but beyond ±65504 (float16's largest)
  int64_t first_non_finite = -1;
  int64_t first_overflow = -1;
};

ValueScan ScanLatent(const v1::Tensor& latent) {
  constexpr float kHalfMax = 65504.0f;
  ValueScan scan;
  const auto note = [&scan](int64_t i, bool finite, bool overflow) {
    if (!finite) {
      if (scan.non_finite++ == 0) scan.first_non_finite = i;
    } else if (overflow) {
      if (scan.overflow++ == 0) scan.first_overflow = i;
    }
  };
  const std::string& data = latent.data();
  if (latent.dtype() == v1::FLOAT32) {
    const int64_t n = static_cast<int64_t>(data.size() / 4);
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, data.data() + 4 * i, 4);
      note(i, std::isfinite(v), std::fabs(v) > kHalfMax);
    }
  } else {
    const int64_t n = static_cast<int64_t>(data.size() / 2);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, data.data() + 2 * i, 2);
      if (latent.dtype() == v1::FLOAT16) {
        note(i, HalfIsFinite(v), false);
      } else {
        note(i, Bf16IsFinite(v), std::fabs(Bf16ToFloat(v)) > kHalfMax);
      }
    }
  }
  return scan;
}

}  // namespace

absl::Status CheckAdmission(const v1::DecodeRequest& request, const v1::ModelInfo& model,
                            const AdmissionLimits& limits) {
  int64_t max_pixels = limits.max_output_pixels;
  if (auto it = limits.max_output_pixels_per_model.find(model.name()); it != limits.max_output_pixels_per_model.end()) {
    max_pixels = it->second;
  }
  const OutputSize out = PredictOutputSize(request, model);
  if (max_pixels > 0 && out.pixels() > max_pixels) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent.shape: ", ShapeString(request.latent().shape()), " decodes to ", out.pixels(),
                     " output pixels (batch ", out.batch, " x ", out.frames, " frame(s) x ", out.height, " x ",
                     out.width, "), more than this server's limit of ", max_pixels, " for model \"", model.name(),
                     "\" (--max_output_pixels); split the batch or the clip"));
  }
  // A model has attention when its calibration measured an attention phase.
  const bool has_attention = model.attention_fixed_bytes() > 0 || model.attention_bytes_per_latent() > 0 ||
                             model.attention_bytes_per_latent_pair() > 0;
  const int64_t factor = std::max<int64_t>(1, model.spatial_factor());
  const int64_t rows = out.height / factor, cols = out.width / factor;
  if (limits.max_attention_tokens > 0 && has_attention && rows * cols > limits.max_attention_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.shape: ", ShapeString(request.latent().shape()), ": model \"", model.name(), "\" attends over all ",
        rows, " x ", cols, " = ", rows * cols,
        " latent positions of a frame in one call, more than this server's limit of ", limits.max_attention_tokens,
        " (--max_attention_tokens; the work grows with their square); decode a smaller image"));
  }
  if (limits.allow_non_finite) return absl::OkStatus();
  const ValueScan scan = ScanLatent(request.latent());
  const int64_t numel =
      static_cast<int64_t>(request.latent().data().size()) / rpc::DTypeSize(request.latent().dtype()).value_or(1);
  if (scan.non_finite > 0) {
    return absl::InvalidArgumentError(absl::StrCat("latent.data: ", scan.non_finite, " of ", numel,
                                                   " values are not finite (NaN or Inf; the first is element ",
                                                   scan.first_non_finite,
                                                   "); the generator diverged, or the server allows them with "
                                                   "--allow_non_finite_latents"));
  }
  if (model.dtype() == "float16" && scan.overflow > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent.data: ", scan.overflow, " of ", numel, " values exceed +-65504 (the first is element ",
        scan.first_overflow, "), which overflows model \"", model.name(),
        "\"'s float16 decode to Inf; scale the latent, or the server allows it with --allow_non_finite_latents"));
  }
  return absl::OkStatus();
}

namespace {

// An encode's image of `batch` x `frames` x `height` x `width` pixels
// (`what` names it in messages) against the pixel and attention limits.
absl::Status CheckEncodeLimits(const v1::ModelInfo& model, const AdmissionLimits& limits, int64_t batch, int64_t frames,
                               int64_t height, int64_t width, const std::string& what) {
  int64_t max_pixels = limits.max_output_pixels;
  if (auto it = limits.max_output_pixels_per_model.find(model.name()); it != limits.max_output_pixels_per_model.end()) {
    max_pixels = it->second;
  }
  const int64_t total = batch * frames * height * width;
  if (max_pixels > 0 && total > max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", total, " pixels, more than this server's limit of ",
                                                   max_pixels, " for model \"", model.name(),
                                                   "\" (--max_output_pixels); split the batch or the clip"));
  }
  const bool has_attention = model.attention_fixed_bytes() > 0 || model.attention_bytes_per_latent() > 0 ||
                             model.attention_bytes_per_latent_pair() > 0;
  const int64_t factor = std::max<int64_t>(1, model.spatial_factor());
  const int64_t rows = height / factor, cols = width / factor;
  if (limits.max_attention_tokens > 0 && has_attention && rows * cols > limits.max_attention_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": model \"", model.name(), "\" attends over all ", rows, " x ", cols,
                     " latent positions of a frame in one call, more than this server's limit of ",
                     limits.max_attention_tokens, " (--max_attention_tokens); encode a smaller image"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEncodeRequest(const v1::EncodeRequest& request, const v1::ModelInfo& model, int group_size,
                                   const AdmissionLimits& limits) {
  if (!v1::Posterior_IsValid(request.posterior())) {
    return absl::InvalidArgumentError(absl::StrCat("posterior: unknown value ", request.posterior()));
  }
  if (!v1::LatentSpace_IsValid(request.latent_space())) {
    return absl::InvalidArgumentError(absl::StrCat("latent_space: unknown value ", request.latent_space()));
  }
  if (request.posterior() == v1::POSTERIOR_MOMENTS && request.latent_space() == v1::LATENT_SPACE_RAW) {
    return absl::InvalidArgumentError("posterior: MOMENTS are returned in VAE space only (latent_space VAE)");
  }
  if (!v1::Mode_IsValid(request.mode()) || request.mode() == v1::MODE_TILED) {
    return absl::InvalidArgumentError("mode: an encode is AUTO, DENSE or EXACT (encodes are not tiled)");
  }
  if (request.mode() == v1::MODE_EXACT && group_size < 2) {
    return absl::InvalidArgumentError("mode: EXACT needs a group of more than one rank; this server's groups have 1");
  }
  if (request.request_id().size() > rpc::kMaxRequestIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", request.request_id().size(), " characters; at most ", rpc::kMaxRequestIdLength));
  }
  if (request.has_image() == !request.encoded_image().empty()) {
    return absl::InvalidArgumentError("image: send one of image (a tensor) and encoded_image (PNG, JPEG or MP4 bytes)");
  }
  if (!request.has_image()) {
    // Admitted by the size its header declares (the pixels it decodes to);
    // the leader decodes it, at most formats::kMaxDecodedImageBytes.
    absl::StatusOr<formats::DeclaredImageSize> size = formats::EncodedImageSize(request.encoded_image());
    if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("encoded_image: ", size.status().message()));
    if (size->video && !model.is_video()) {
      return absl::InvalidArgumentError(absl::StrCat("encoded_image: an MP4 is a clip, and model \"", model.name(),
                                                     "\" encodes images (send a PNG or JPEG)"));
    }
    // A video model encodes a still image as a one-frame clip (worker/encode_job.h).
    return CheckEncodeLimits(
        model, limits, 1, size->frames, size->height, size->width,
        absl::StrCat("encoded_image (", size->video ? absl::StrCat(size->frames, " frames of ") : "", size->width, "x",
                     size->height, ")"));
  }
  const v1::Tensor& image = request.image();
  const bool pixels = image.dtype() == v1::UINT8;
  if (!pixels && image.dtype() != v1::FLOAT32 && image.dtype() != v1::FLOAT16 && image.dtype() != v1::BFLOAT16) {
    return absl::InvalidArgumentError("image.dtype: FLOAT32, FLOAT16, BFLOAT16 or UINT8 (pixels)");
  }
  ASSIGN_OR_RETURN(int64_t numel, rpc::CountElements(image.shape(), "image.shape"));
  ASSIGN_OR_RETURN(int64_t element, rpc::DTypeSize(image.dtype()));
  if (static_cast<int64_t>(image.data().size()) != numel * element) {
    return absl::InvalidArgumentError(absl::StrCat("image.data: ", image.data().size(), " bytes, but shape ",
                                                   ShapeString(image.shape()), " needs ", numel * element));
  }
  const int want_dims = model.is_video() ? 5 : 4;
  if (image.shape_size() != want_dims) {
    return absl::InvalidArgumentError(absl::StrCat("image.shape: ", ShapeString(image.shape()), " for model \"",
                                                   model.name(), "\", which encodes ",
                                                   model.is_video() ? "[B, C, T, H, W] clips ([B, T, H, W, C] as UINT8)"
                                                                    : "[B, C, H, W] images ([B, H, W, C] as UINT8)"));
  }
  // Pixels: [B, (T,) H, W, C]; floats: [B, C, (T,) H, W].
  const int64_t h = pixels ? image.shape(want_dims - 3) : image.shape(want_dims - 2);
  const int64_t w = pixels ? image.shape(want_dims - 2) : image.shape(want_dims - 1);
  const int64_t frames = model.is_video() ? (pixels ? image.shape(1) : image.shape(2)) : 1;
  return CheckEncodeLimits(model, limits, image.shape(0), frames, h, w,
                           absl::StrCat("image.shape: ", ShapeString(image.shape())));
}

}  // namespace vaedecode::server
