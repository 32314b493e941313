#include "server/remote_decode.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/latent_tensor.h"
#include "rpc/modes.h"
#include "rpc/output_formats.h"
#include "rpc/request_options.h"
#include "rpc/status_macros.h"

namespace vaedecode::server {

absl::StatusOr<std::string> UnpackPackedLatent(const std::string& packed, int64_t element_size,
                                               const std::vector<int64_t>& packed_shape, int64_t height, int64_t width,
                                               int64_t token_pixels, Packing packing,
                                               std::vector<int64_t>* unpacked_shape) {
  if (packed_shape.size() != 3) {
    return BadQueryParam("shape",
                         absl::StrCat("a packed latent is [B, tokens, channels]; got ", JsonShape(packed_shape)));
  }
  // Every size is bounded before anything is multiplied or read.
  ASSIGN_OR_RETURN(int64_t numel, rpc::CountElements(packed_shape, "query parameter shape"));
  const int64_t batch = packed_shape[0], tokens = packed_shape[1], packed_channels = packed_shape[2];
  const int64_t rows = height / token_pixels, cols = width / token_pixels;  // tokens per column and row
  if (rows < 1 || cols < 1) {
    return BadQueryParam("height/width", absl::StrCat(height, "x", width, " is smaller than one token of ",
                                                      token_pixels, "x", token_pixels, " pixels"));
  }
  if (rows > tokens / cols || rows * cols != tokens) {
    return BadQueryParam("shape", absl::StrCat("a ", height, "x", width, " image packs into ",
                                               rows <= tokens / cols ? absl::StrCat(rows * cols) : std::string("more"),
                                               " tokens (", token_pixels, "x", token_pixels,
                                               " pixels each); the latent ", JsonShape(packed_shape), " has ", tokens));
  }
  if (packing == Packing::kPatches2x2 && packed_channels % 4 != 0) {
    return BadQueryParam("shape", absl::StrCat("a packed latent's last dimension is 4 x channels (2x2 patches); got ",
                                               packed_channels, " in ", JsonShape(packed_shape)));
  }
  const int64_t want = numel * element_size;
  if (static_cast<int64_t>(packed.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("body: ", packed.size(), " bytes, but shape ", JsonShape(packed_shape), " needs ", want));
  }
  std::string out(packed.size(), '\0');
  if (packing == Packing::kFlatten) {
    // out[b, k, i, j] = in[b, i·cols + j, k]
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < tokens; ++t) {
        const char* token = packed.data() + (b * tokens + t) * packed_channels * element_size;
        for (int64_t k = 0; k < packed_channels; ++k) {
          std::memcpy(out.data() + ((b * packed_channels + k) * tokens + t) * element_size, token + k * element_size,
                      element_size);
        }
      }
    }
    *unpacked_shape = {batch, packed_channels, rows, cols};
    return out;
  }
  const int64_t channels = packed_channels / 4, h = 2 * rows, w = 2 * cols;
  // out[b, c, 2i + di, 2j + dj] = in[b, i·cols + j, 4c + 2di + dj]
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const char* patch = packed.data() + ((b * tokens + i * cols + j) * packed_channels) * element_size;
        for (int64_t c = 0; c < channels; ++c) {
          for (int64_t di = 0; di < 2; ++di) {
            for (int64_t dj = 0; dj < 2; ++dj) {
              const int64_t dst = ((b * channels + c) * h + 2 * i + di) * w + 2 * j + dj;
              std::memcpy(out.data() + dst * element_size, patch + (4 * c + 2 * di + dj) * element_size, element_size);
            }
          }
        }
      }
    }
  }
  *unpacked_shape = {batch, channels, h, w};
  return out;
}

absl::StatusOr<RemoteDecodeCall> TranslateRemoteDecode(const QueryParams& params, std::string body,
                                                       const v1::ModelInfo& model) {
  RemoteDecodeCall call;
  v1::DecodeRequest& r = call.request;
  r.set_model(model.name());

  // dtype and shape.
  ASSIGN_OR_RETURN(const std::string* dtype, SingleQueryParam(params, "dtype"));
  if (dtype == nullptr) return BadQueryParam("dtype", "missing; float16, bfloat16 or float32");
  int64_t element_size = 0;
  if (*dtype == "float32") {
    r.mutable_latent()->set_dtype(v1::FLOAT32);
    element_size = 4;
  } else if (*dtype == "float16") {
    r.mutable_latent()->set_dtype(v1::FLOAT16);
    element_size = 2;
  } else if (*dtype == "bfloat16") {
    r.mutable_latent()->set_dtype(v1::BFLOAT16);
    element_size = 2;
  } else {
    return BadQueryParam("dtype", absl::StrCat("\"", *dtype, "\"; use float16, bfloat16 or float32"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, RepeatedPositiveQueryParam(params, "shape"));
  if (shape.empty()) return BadQueryParam("shape", "missing; repeat it once per dimension (shape=1&shape=4&...)");

  // vaedecode's request options (rpc/request_options.h), by their names.
  for (const rpc::OptionInfo& option : rpc::RequestOptions()) {
    if ((option.surfaces & rpc::kHttp) == 0) continue;
    ASSIGN_OR_RETURN(const std::string* value, SingleQueryParam(params, option.name));
    if (value == nullptr) continue;
    if (absl::Status s = rpc::SetOption(option, *value, r); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("query parameter ", s.message()));
    }
  }
  // remote_decode's rules for the latent's space: a scale or a shift means a
  // raw latent de-normalised with them (a shift alone takes the model's own
  // scale); do_scaling means raw with the model's own formula.
  ASSIGN_OR_RETURN(const std::string* space, SingleQueryParam(params, "latent_space"));
  ASSIGN_OR_RETURN(const std::string* do_scaling, SingleQueryParam(params, "do_scaling"));
  if (r.has_shift_factor() && !r.has_scaling_factor()) r.set_scaling_factor(model.scaling_factor());
  if (r.has_scaling_factor()) {
    if (space != nullptr && r.latent_space() == v1::LATENT_SPACE_VAE) {
      return BadQueryParam("latent_space", "vae contradicts scaling_factor/shift_factor");
    }
    r.set_latent_space(v1::LATENT_SPACE_RAW);
  } else if (do_scaling != nullptr && space == nullptr) {
    ASSIGN_OR_RETURN(const bool scale, ParseBoolQueryParam("do_scaling", *do_scaling));
    if (scale) r.set_latent_space(v1::LATENT_SPACE_RAW);
  }

  // Packed latents [B, tokens, channels] with the image's height and width:
  // FLUX.1's 2x2 patches, or FLUX.2's flattened raw latent (raw_patch 2),
  // whose VAE-space form is the same 2x2 scatter.
  ASSIGN_OR_RETURN(const std::string* height, SingleQueryParam(params, "height"));
  ASSIGN_OR_RETURN(const std::string* width, SingleQueryParam(params, "width"));
  if (shape.size() == 3 && !model.is_audio()) {  // an audio VAE's [B, C, L] or packed [B, L, C·M] is its own
    if (height == nullptr || width == nullptr) {
      return BadQueryParam("height/width", "a packed latent [B, tokens, channels] needs the image's height and width");
    }
    if (model.is_video())
      return BadQueryParam("shape", absl::StrCat("model \"", model.name(), "\" takes 5-D video latents"));
    ASSIGN_OR_RETURN(const int64_t h, ParsePositiveQueryParam("height", *height));
    ASSIGN_OR_RETURN(const int64_t w, ParsePositiveQueryParam("width", *width));
    const int64_t factor = std::max<int64_t>(1, model.spatial_factor());
    const bool flattened = model.raw_patch() > 1 && r.latent_space() == v1::LATENT_SPACE_RAW;
    const int64_t token_pixels = factor * (model.raw_patch() > 1 ? model.raw_patch() : 2);
    if (flattened && model.raw_latent_channels() > 0 && shape[2] != model.raw_latent_channels()) {
      return BadQueryParam("shape",
                           absl::StrCat("model \"", model.name(), "\" packs ", model.raw_latent_channels(),
                                        " raw channels per token; the latent ", JsonShape(shape), " has ", shape[2]));
    }
    std::vector<int64_t> unpacked;
    ASSIGN_OR_RETURN(body, UnpackPackedLatent(body, element_size, shape, h, w, token_pixels,
                                              flattened ? Packing::kFlatten : Packing::kPatches2x2, &unpacked));
    shape = unpacked;
  }
  // An audio latent to mux into the MP4: its bytes follow the video
  // latent's in the body.
  // (audio_model and audio_latent_space are request options, read above.)
  ASSIGN_OR_RETURN(const std::vector<int64_t> audio_shape, RepeatedPositiveQueryParam(params, "audio_shape"));
  const bool muxed = !audio_shape.empty() || !r.audio_model().empty();
  if (muxed) {
    if (audio_shape.empty() || r.audio_model().empty()) {
      return BadQueryParam("audio_model/audio_shape", "an audio latent needs both (its bytes follow the latent's)");
    }
    int64_t video_bytes = element_size;
    for (int64_t d : shape) {
      if (__builtin_mul_overflow(video_bytes, d, &video_bytes)) return BadQueryParam("shape", "too large");
    }
    if (video_bytes > static_cast<int64_t>(body.size())) {
      return BadQueryParam("shape", absl::StrCat("the latent needs ", video_bytes, " bytes; the body has ", body.size(),
                                                 " (the audio latent's bytes follow the latent's)"));
    }
    v1::Tensor* audio = r.mutable_audio_latent();
    audio->set_dtype(r.latent().dtype());  // one dtype for the body
    for (int64_t d : audio_shape) audio->add_shape(d);
    audio->set_data(body.substr(static_cast<size_t>(video_bytes)));
    body.resize(static_cast<size_t>(video_bytes));
  }
  for (int64_t d : shape) r.mutable_latent()->add_shape(d);
  r.mutable_latent()->set_data(std::move(body));

  // What comes back.
  ASSIGN_OR_RETURN(const std::string* output_type, SingleQueryParam(params, "output_type"));
  ASSIGN_OR_RETURN(const std::string* image_format, SingleQueryParam(params, "image_format"));
  ASSIGN_OR_RETURN(const std::string* partial, SingleQueryParam(params, "partial_postprocess"));
  // An audio VAE's default: a WAV of its waveform, or the tensor of a mel spectrogram.
  const bool waveform = model.is_audio() && rpc::OutputKindOf(model, r) == rpc::OutputKind::kWaveform;
  const std::string type = output_type != nullptr ? *output_type : waveform ? "wav" : model.is_audio() ? "pt" : "pil";
  bool partial_postprocess = false;
  if (partial != nullptr) {
    ASSIGN_OR_RETURN(partial_postprocess, ParseBoolQueryParam("partial_postprocess", *partial));
  }
  ASSIGN_OR_RETURN(const std::string* wav_encoding, SingleQueryParam(params, "wav_encoding"));
  if (wav_encoding != nullptr && type != "wav") return BadQueryParam("wav_encoding", "applies to output_type=wav");
  if (model.is_audio()) {
    if (partial_postprocess) {
      return BadQueryParam("partial_postprocess",
                           absl::StrCat("model \"", model.name(), "\" is an audio VAE: no pixels"));
    }
    if (type == "wav") {
      if (shape[0] != 1) {
        return BadQueryParam("output_type", absl::StrCat("wav returns one file; this latent has a batch of ", shape[0],
                                                         " (send them one by one, or use output_type=pt)"));
      }
      const std::string encoding = wav_encoding == nullptr ? "pcm16" : *wav_encoding;
      if (encoding != "pcm16" && encoding != "float32") {
        return BadQueryParam("wav_encoding", absl::StrCat("\"", encoding, "\"; use pcm16 or float32"));
      }
      r.set_output_format(encoding == "pcm16" ? v1::OUTPUT_WAV : v1::OUTPUT_WAV_FLOAT32);
      call.reply = RemoteReply::kAudioFile;
      return call;
    }
    if (type != "pt") {
      return BadQueryParam("output_type",
                           absl::StrCat("\"", type, "\": model \"", model.name(), "\" is an audio VAE; use wav or pt"));
    }
  }
  ASSIGN_OR_RETURN(const std::string* output_dtype, SingleQueryParam(params, "output_dtype"));
  if (output_dtype != nullptr && (type != "pt" || partial_postprocess)) {
    return BadQueryParam("output_dtype", "applies to output_type=pt tensors (without partial_postprocess)");
  }
  if (type == "pt") {
    call.reply = partial_postprocess ? RemoteReply::kPixels : RemoteReply::kTensor;
    r.set_output_format(partial_postprocess ? v1::OUTPUT_UINT8 : v1::OUTPUT_FLOAT32);
    if (output_dtype != nullptr) {
      // The decoder's output in another dtype: the output formats that are
      // a channels-first tensor (rpc/output_formats.h).
      std::vector<std::string> names;
      const rpc::OutputFormatInfo* found = nullptr;
      for (const rpc::OutputFormatInfo& f : rpc::OutputFormats()) {
        if (f.encoded || f.channels_last) continue;
        names.push_back(f.name);
        if (f.name == *output_dtype) found = &f;
      }
      if (found == nullptr) {
        return BadQueryParam("output_dtype", absl::StrCat("\"", *output_dtype, "\"; use ", absl::StrJoin(names, ", ")));
      }
      r.set_output_format(found->format);
    }
  } else if (type == "pil") {
    if (model.is_video()) {
      call.reply = RemoteReply::kVideoFrames;
      r.set_output_format(v1::OUTPUT_FLOAT32);
    } else {
      // The image files of rpc/output_formats.h, by name or alias.
      const std::string format = image_format == nullptr ? "jpg" : *image_format;
      absl::StatusOr<const rpc::OutputFormatInfo*> f = rpc::ParseOutputFormat(format);
      if (!f.ok() || (*f)->chunking != rpc::Chunking::kFilePerImage) {
        return BadQueryParam("image_format", absl::StrCat("\"", format, "\"; use jpg or png"));
      }
      r.set_output_format((*f)->format);
      if (shape[0] != 1) {
        return BadQueryParam("output_type", absl::StrCat("pil returns one image; this latent has a batch of ", shape[0],
                                                         " (send them one by one, or use output_type=pt)"));
      }
      call.reply = RemoteReply::kImageFile;
    }
  } else if (type == "mp4") {
    if (!model.is_video()) {
      return BadQueryParam("output_type", absl::StrCat("mp4 is for video models; model \"", model.name(),
                                                       "\" decodes images (use pil or pt)"));
    }
    if (shape[0] != 1) {
      return BadQueryParam("output_type", absl::StrCat("mp4 returns one video; this latent has a batch of ", shape[0],
                                                       " (send them one by one, or use output_type=pt)"));
    }
    r.set_output_format(v1::OUTPUT_MP4);
    call.reply = RemoteReply::kVideoFile;
    return call;
  } else {
    return BadQueryParam("output_type", absl::StrCat("\"", type, "\"; use pil, pt or mp4"));
  }
  if (muxed) return BadQueryParam("audio_model", "an audio latent is muxed into output_type=mp4");
  return call;
}

HttpReply BuildRemoteDecodeReply(RemoteReply kind, CollectedOutput output) {
  if (!output.status.ok()) return ErrorReply(output.status);
  const v1::Header& h = output.header;
  const rpc::OutputFormatInfo* format = rpc::FindOutputFormat(h.output_format());
  if (format == nullptr) return ErrorReply(absl::InternalError("the group's header has an unknown output format"));
  std::vector<int64_t> shape(h.shape().begin(), h.shape().end());
  HttpReply reply;
  switch (kind) {
    case RemoteReply::kImageFile:
      if (output.images.size() != 1) {
        return ErrorReply(
            absl::InternalError(absl::StrCat("expected one image, the decode made ", output.images.size())));
      }
      reply.content_type = format->mime_type;
      reply.body = std::move(output.images[0]);
      break;
    case RemoteReply::kVideoFile:
    case RemoteReply::kAudioFile:
      if (output.images.size() != 1) {
        return ErrorReply(
            absl::InternalError(absl::StrCat("expected one file, the decode made ", output.images.size())));
      }
      reply.content_type = format->mime_type;
      reply.body = std::move(output.images[0]);
      break;
    case RemoteReply::kTensor:
      // The format's name is the torch dtype's (remote_decode's DTYPE_MAP).
      reply = TensorReply(std::move(output.tensor), shape, format->name);
      break;
    case RemoteReply::kPixels: {
      // [B, (T,) H, W, C]: video frames flattened so each entry is one image.
      if (shape.size() == 5) shape = {shape[0] * shape[1], shape[2], shape[3], shape[4]};
      reply = TensorReply(std::move(output.tensor), shape, "uint8");
      break;
    }
    case RemoteReply::kVideoFrames: {
      if (shape.size() != 5) return ErrorReply(absl::InternalError("a video model returned a 4-D sample"));
      // [B, C, T, H, W] in [-1, 1] -> [B·T, C, H, W] in [0, 1] (the video
      // processor's postprocess), float32.
      const int64_t B = shape[0], C = shape[1], T = shape[2], plane = shape[3] * shape[4];
      const auto* in = reinterpret_cast<const float*>(output.tensor.data());
      std::string body(output.tensor.size(), '\0');
      auto* out = reinterpret_cast<float*>(body.data());
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t t = 0; t < T; ++t) {
            const float* src = in + ((b * C + c) * T + t) * plane;
            float* dst = out + ((b * T + t) * C + c) * plane;
            for (int64_t i = 0; i < plane; ++i) dst[i] = std::clamp(src[i] / 2 + 0.5f, 0.0f, 1.0f);
          }
        }
      }
      reply = TensorReply(std::move(body), {B * T, C, shape[3], shape[4]}, "float32");
      break;
    }
  }
  AddCallHeaders(output.request_id, v1::Mode_Name(h.mode()), output.trailer.timings().decode_ms(),
                 output.trailer.timings().queue_ms(), reply);
  if (h.has_noise_seed()) reply.headers.emplace_back("X-Vaedecode-Noise-Seed", absl::StrCat(h.noise_seed()));
  if (h.sample_rate() > 0) reply.headers.emplace_back("X-Vaedecode-Sample-Rate", absl::StrCat(h.sample_rate()));
  return reply;
}

}  // namespace vaedecode::server
