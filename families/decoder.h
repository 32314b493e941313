#pragma once

// What every family decoder offers the worker: identity and geometry of the
// model, latent-space conversion, and a decode that runs through LayerOps.
//
// Threading: a Decoder is not thread-safe; one job at a time per instance.
// Errors: Decode and ToVaeSpace run LibTorch ops and may throw c10::Error;
// worker/decode_job.h is the one place that turns those into absl::Status.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "families/layer_ops.h"
#include "families/pixel_convention.h"
#include "rpc/output_frames.h"

namespace vaedecode::families {

// Where a request's latent comes from.
enum class LatentSpace {
  kVae,  // already the decoder input: passed to decode() unchanged
  kRaw,  // the denoiser's output: de-normalised as the family's pipeline does
};

// Per-request inputs of a decode beyond the latent: diffusers'
// vae.decode(z, temb) for timestep-conditioned decoders (LTX), and which
// stage an audio VAE with a vocoder returns.
struct DecodeConditioning {
  // The decode timestep (LTX2Pipeline's decode_timestep); unset: 0.0, the
  // pipeline's default. Ignored by decoders that are not conditioned.
  std::optional<double> timestep;
  // An audio VAE followed by a vocoder (LTX-2's): the mel spectrogram
  // [B, C, frames, mel_bins] vae.decode gives, instead of the vocoder's
  // waveform. Ignored by every other decoder.
  bool mel_spectrogram = false;
};

struct ModelInfo {
  std::string family;           // registry name, e.g. "autoencoder_kl"
  std::string diffusers_class;  // config "_class_name", e.g. "AutoencoderKL"
  std::string config_json;      // the config as loaded (for `info`)
  int64_t latent_channels = 0;
  // A `raw` latent's channels and how many VAE-space latents each of its
  // rows/columns unpacks into (FLUX.2 packs 2x2 patches: 4x the channels,
  // half the size); 0 channels = the same as latent_channels.
  int64_t raw_latent_channels = 0;
  int64_t raw_patch = 1;
  int64_t out_channels = 0;
  int64_t spatial_factor = 1;   // output pixels per latent row/column
  int64_t temporal_factor = 1;  // 1 for image families
  // Output frames per latent frame count beyond the causal formula (empty
  // for every video family but MiniMax-H3); OutputShape and the frontend's
  // output-size prediction both read it.
  rpc::OutputFrameTable output_frames;
  bool is_video = false;  // latents are NCTHW when true, NCHW otherwise
  // An audio VAE: latents decode to waveforms [B, out_channels, samples] at
  // `sample_rate`, about `samples_per_latent` samples per latent frame
  // (MiniMax-H3's from [B, C, L]; LTX-2's from [B, C, L, M] through its mel
  // spectrogram and vocoder, or to the mel spectrogram alone when the folder
  // has no vocoder: sample_rate 0 then). Decoded dense, on one rank.
  bool is_audio = false;
  int64_t sample_rate = 0;
  int64_t samples_per_latent = 0;
  // An audio latent [B, C, L, M]'s M (LTX-2's latent mel bins, as its
  // decoder takes them); 0 for [B, C, L]. Peak calibration decodes
  // [1, C, L(, M)] latents of a few lengths L.
  int64_t latent_bins = 0;
  // An audio VAE's mel spectrogram (LTX-2's; its output without a vocoder,
  // or asked for): mel frames per latent frame, and its bins (0: as many as
  // the latent's, mel_bins null). 0 frames for a VAE without a mel stage.
  int64_t mel_frames_per_latent = 0;
  int64_t mel_bins = 0;
  // Latent frames a decode holds at once, for its memory (tiling/
  // memory_model.h): 1 for images and frame-by-frame decoders (Wan's causal
  // cache), a temporal window, or 0 for the whole clip.
  int64_t peak_latent_frames = 1;
  // The fewest latent frames a decode accepts (MiniMax-H3: 3, the shortest
  // latent that makes a window); peak calibration decodes that many.
  int64_t min_latent_frames = 1;
  double scaling_factor = 1.0;
  std::optional<double> shift_factor;
  int64_t parameter_count = 0;  // decoder-side parameters actually used
  // How `raw` latents are de-normalised, as a formula for humans.
  std::string raw_to_vae_formula;
  // diffusers' own tiled decode for this model, in latents: tile side and
  // stride (the tiling planner never decodes more latents than this layout).
  int64_t stock_tile = 32;
  int64_t stock_stride = 24;
  // The config's `force_upcast`: diffusers' SD/SDXL pipelines decode this
  // VAE in float32 when it is asked for float16 (SDXL's VAE overflows in
  // float16). See DecodeDtype.
  bool force_upcast = false;
  // decode() takes a timestep (LTX's timestep_conditioning).
  bool timestep_conditioning = false;
  // A stream of this decoder holds frames back until it is told the clip
  // ended (DecodeStream::DecodeChunk's clip_ends): MiniMax-H3's last window
  // is decoded from the clip's end padded, and the overlap a window fades
  // into the next is final only then. A session must say its last chunk.
  bool stream_holds_clip_end = false;
  // Whether the decoder may be run on spatial tiles (TILED mode). Off for a
  // decoder whose output depends on the whole frame in a way tiles cannot
  // reproduce or that its reference does not define untiled (a ViT decoder:
  // MiniMax-H3).
  bool spatial_tiling = true;
  // The exact path has no GroupNorm and at most one attention to carry the
  // leader's cancellation to the group (LTX-2, HunyuanVideo 1.5): it also
  // rides the halo exchanges (ShardedLayerOps::set_cancel_with_halo), one int64
  // per message more, so a cancel stops the group within W - 1 convolutions.
  bool cancel_with_halo = false;
  // Where this decode differs from the reference pipeline's default, for
  // `info`, GetModel and the README ("" when it does not).
  std::string decode_note;
  // What 8-bit pixels (PNG, JPEG, MP4, UINT8 outputs) are made from
  // (MiniMax-H3: ImageNet-normalised samples).
  PixelConvention pixels;
  // Config keys the decoder neither reads nor knows (a misspelt key, a key of
  // another class); loaders warn with them. diffusers ignores them too.
  std::vector<std::string> unread_config_keys;
  // Config keys that disagree with the structure the decoder builds
  // (metadata a pipeline reads, like Wan's scale_factor_spatial): decoded
  // as the structure says, as diffusers does; loaders warn with these.
  std::vector<std::string> config_warnings;
};

// "float32", "bfloat16", "float16"; LibTorch's name for other dtypes.
std::string DtypeName(at::ScalarType dtype);

// The inverse for the compute dtypes: "float32" (or "fp32"), "bfloat16"
// ("bf16"), "float16" ("fp16"); INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<at::ScalarType> ParseDtype(const std::string& name);

// The dtype a model decodes in when `requested` is asked for, as diffusers'
// pipelines choose it: float32 instead of float16 when the config sets
// force_upcast, float32 always for an audio VAE (its
// _keep_in_fp32_modules); `requested` otherwise.
at::ScalarType DecodeDtype(const ModelInfo& info, at::ScalarType requested);

// Why DecodeDtype differs from `requested` (for response headers and logs);
// "" when it does not.
std::string DecodeDtypeReason(const ModelInfo& info, at::ScalarType requested);

// One clip decoded chunk by chunk (a streaming session's state on one rank:
// its row band in exact mode): what a causal decoder carries from one latent
// frame to the next (Wan's per-conv feature cache, HunyuanVideo 1.5's and
// LTX-2's causal conv frames; MiniMax-H3's latents of the next window and
// its faded overlap) lives here between chunks. The chunks' outputs,
// concatenated on frames, are the whole clip's Decode: a streaming
// family's Decode is one chunk of a fresh stream, and with whole tensors
// (dense ops) a causal stream (StatefulDecodeStream) steps a latent frame at
// a time whatever the chunk, a window stream a window at a time, so every
// chunking runs the same ops on the same extents (bit for bit); over row
// bands (LayerOps::HoldsRowBand) a chunk goes through each layer at once,
// one collective per layer for the chunk (up to rounding). A chunk returns
// Decoder::StreamedFrames' count, which may be none.
//
// Threading and errors as Decoder's; a chunk that threw leaves the state
// undefined (the caller drops the stream and rebuilds it from the history).
class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  // The next latent frames of the clip, z: [B, C, t, H, W] (t >= 1) in VAE
  // space and the decoder's dtype, every chunk of one batch, channels and
  // size -> their output frames. Finished frames go to ops.FramesFinished.
  // `clip_ends`: z holds the clip's last latent frames, so nothing need be
  // kept for a next chunk (a whole Decode's one chunk).
  virtual at::Tensor DecodeChunk(const at::Tensor& z, LayerOps& ops, bool clip_ends) = 0;
  at::Tensor DecodeChunk(const at::Tensor& z, LayerOps& ops) { return DecodeChunk(z, ops, /*clip_ends=*/false); }
  // Bytes the state holds between chunks (on the decoder's device).
  virtual int64_t state_bytes() const = 0;
  // Latent frames decoded so far.
  virtual int64_t latent_frames() const = 0;
};

// A [B, C, frames, H, W] output of a known frame count, filled in order as
// its frames come, so a long one is never held twice by a concatenation.
// Allocated at the first frames (their batch, channels, size, dtype and
// device); frames that fill it alone, owning their buffer, are kept as
// they are.
class FrameOutput {
 public:
  explicit FrameOutput(int64_t frames = 0) : frames_(frames) {}
  // Copies in the first of `frames` that fit; returns how many.
  int64_t Add(const at::Tensor& frames);
  int64_t filled() const { return filled_; }
  bool full() const { return filled_ == frames_; }
  // The frames filled (copied out when short of the count); undefined when none.
  at::Tensor Take();

 private:
  int64_t frames_;
  at::Tensor out_;
  int64_t filled_ = 0;
};

// A chunk's frames, step by step, as one tensor. A whole Decode is one long
// chunk: once two steps have said how many frames a step returns (a causal
// decoder's first may return fewer) the rest go into a FrameOutput sized
// for them; a step returning another count falls back to concatenating.
class ChunkFrames {
 public:
  explicit ChunkFrames(int64_t steps) : steps_(steps) {}
  void Add(at::Tensor frames);
  at::Tensor Take();

 private:
  const int64_t steps_;
  int64_t added_ = 0;
  std::optional<FrameOutput> out_;  // sized after the second step
  std::vector<at::Tensor> parts_;   // frames not in out_, in order after its
};

// A DecodeStream whose state is a `State` (with `int64_t bytes() const`)
// that `step(z, ops, state, clip_ends)` carries from chunk to chunk, stepped
// as DecodeStream says (a latent frame at a time on whole tensors; the
// clip's last step told so); no gradients. Each step's frames go to
// ops.FramesFinished, unless the step says them itself
// (`step_announces_frames`: Wan's).
template <typename State>
class StatefulDecodeStream final : public DecodeStream {
 public:
  using Step = std::function<at::Tensor(const at::Tensor& z, LayerOps& ops, State& state, bool clip_ends)>;
  explicit StatefulDecodeStream(Step step, bool step_announces_frames = false)
      : step_(std::move(step)), step_announces_frames_(step_announces_frames) {}

  using DecodeStream::DecodeChunk;
  at::Tensor DecodeChunk(const at::Tensor& z, LayerOps& ops, bool clip_ends) override {
    at::NoGradGuard no_grad;
    const int64_t steps = ops.HoldsRowBand() ? 1 : z.size(2);
    ChunkFrames frames(steps);
    for (int64_t i = 0; i < steps; ++i) {
      at::Tensor step_frames = step_(steps == 1 ? z : z.narrow(2, i, 1), ops, state_, clip_ends && i == steps - 1);
      if (!step_announces_frames_) ops.FramesFinished(step_frames);
      frames.Add(std::move(step_frames));
    }
    latent_frames_ += z.size(2);
    return frames.Take();
  }
  int64_t state_bytes() const override { return state_.bytes(); }
  int64_t latent_frames() const override { return latent_frames_; }

 private:
  const Step step_;
  const bool step_announces_frames_;
  State state_;
  int64_t latent_frames_ = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;

  virtual const ModelInfo& info() const = 0;

  // Checks rank, channels and sizes of a latent for this model.
  virtual absl::Status ValidateLatent(const at::Tensor& latent) const;
  // The same for a streaming session's chunk, which may be shorter than the
  // shortest clip (the clip's length is checked at its end).
  virtual absl::Status ValidateChunk(const at::Tensor& latent) const { return ValidateLatent(latent); }
  // The same for a decode with `conditioning` (an audio VAE asked for its mel
  // spectrogram needs no latent its vocoder takes).
  virtual absl::Status ValidateLatentFor(const at::Tensor& latent, const DecodeConditioning& conditioning) const {
    (void)conditioning;
    return ValidateLatent(latent);
  }

  // The family pipeline's de-normalisation of a denoiser latent.
  virtual at::Tensor ToVaeSpace(const at::Tensor& raw) const = 0;

  // decode(z).sample of the diffusers class: z in VAE space, in the decoder's
  // dtype. Layers whose result depends on other rows run through `ops`.
  virtual at::Tensor Decode(const at::Tensor& z, LayerOps& ops) = 0;
  // The same with the request's conditioning; families without any ignore it.
  virtual at::Tensor Decode(const at::Tensor& z, LayerOps& ops, const DecodeConditioning& conditioning) {
    (void)conditioning;
    return Decode(z, ops);
  }

  // Weights and activations in `dtype` (kFloat, kBFloat16, kHalf), exactly;
  // callers that serve a requested dtype convert with ApplyDecodeDtype.
  virtual void ToDtype(at::ScalarType dtype) = 0;
  virtual at::ScalarType dtype() const = 0;

  // Weights and buffers on `device` (CPU after loading). Decode and
  // ToVaeSpace take their inputs on this device and create every other
  // tensor there; callers move latents in and results out.
  virtual void ToDevice(const c10::Device& device) = 0;
  virtual c10::Device device() const = 0;

  // OK when a latent of this shape can be decoded exactly sharded over
  // `world_size` row bands; otherwise the reason it cannot (the caller falls
  // back to dense and logs it). The family knows each layer's halo.
  virtual absl::Status CheckExactSharding(const std::vector<int64_t>& latent_shape, int world_size) const;

  // OK when a clip can be decoded chunk by chunk (OpenStream), its frames
  // equal to the whole clip's; otherwise why not (a decoder that is not
  // causal in time, an image model).
  virtual absl::Status CheckStreaming() const;
  // A fresh stream (no latent frame seen) when CheckStreaming is OK, every
  // chunk decoded with `conditioning` (LTX-2's timestep); the stream uses
  // this decoder's modules, which must outlive it.
  virtual std::unique_ptr<DecodeStream> OpenStream(const DecodeConditioning& conditioning);
  std::unique_ptr<DecodeStream> OpenStream() { return OpenStream(DecodeConditioning{}); }
  // Output frames a stream has returned, in all, once it has taken
  // `latent_frames` latent frames in any chunks, the clip's last among them
  // when `clip_ended`. The whole clip's count either way for a causal
  // decoder; fewer before the end where frames wait for later latents
  // (info().stream_holds_clip_end). Chunking never changes it.
  virtual int64_t StreamedFrames(int64_t latent_frames, bool clip_ended) const;

  // Output shape for a latent shape (NCHW or NCTHW), from info()'s geometry.
  virtual std::vector<int64_t> OutputShape(const std::vector<int64_t>& latent_shape) const;
  // The same for a decode with `conditioning` (an audio VAE asked for its mel
  // spectrogram returns that instead of the waveform).
  virtual std::vector<int64_t> OutputShapeFor(const std::vector<int64_t>& latent_shape,
                                              const DecodeConditioning& conditioning) const {
    (void)conditioning;
    return OutputShape(latent_shape);
  }
};

// Converts a float32-loaded decoder to DecodeDtype(decoder.info(), requested).
void ApplyDecodeDtype(Decoder& decoder, at::ScalarType requested);

}  // namespace vaedecode::families
