#include "families/minimax_h3/decoder.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "families/minimax_h3/encoder.h"
#include "families/status_error.h"
#include "rpc/status_macros.h"

namespace vaedecode::families::minimax_h3 {
namespace {

ModelInfo Describe(const MiniMaxH3Config& c, std::string config_json) {
  ModelInfo info;
  info.family = "minimax_h3";
  info.diffusers_class = "AutoencoderKLMiniMaxH3";
  info.config_json = std::move(config_json);
  info.unread_config_keys = c.unread_keys;
  info.latent_channels = c.latent_channels;
  info.out_channels = c.out_channels;
  info.spatial_factor = c.patch_size();
  info.temporal_factor = c.patch_size_t();
  info.is_video = true;
  info.pixels = PipelinePixels(c.out_channels);
  // Every decode runs one window at a time, none longer than
  // window_latent_frames: the memory model saturates at the shortest latent
  // whose (padded) first window is that long. With token_drop below
  // tokens_chunk_size that is the shortest latent decoded at all.
  info.min_latent_frames = 1;
  while (c.Windows(info.min_latent_frames).windows == 0) ++info.min_latent_frames;
  info.peak_latent_frames = info.min_latent_frames;
  while (info.peak_latent_frames + c.Windows(info.peak_latent_frames).pad_frames < c.window_latent_frames()) {
    ++info.peak_latent_frames;
  }
  // Output frames: one more window per tokens_chunk_size latent frames adds
  // the same frames once two windows cross-fade; tabulate up to there.
  const int64_t period = c.tokens_chunk_size();
  const int64_t table_size = info.min_latent_frames + c.window_latent_frames() + 2 * period;
  for (int64_t t = 0; t < table_size; ++t) info.output_frames.frames.push_back(c.Windows(t).output_frames);
  info.output_frames.period = period;
  info.output_frames.frames_per_period =
      c.Windows(table_size).output_frames - c.Windows(table_size - period).output_frames;
  info.raw_to_vae_formula = "z * latents_std + latents_mean";
  info.stream_holds_clip_end = true;
  info.spatial_tiling = false;
  info.decode_note =
      "decoded untiled (exact); diffusers' AutoencoderKLMiniMaxH3 decodes in 256x256-pixel tiles with a linear "
      "blend by default: the same for frames up to 256x256 pixels, different above (measured up to 1.1e-2, "
      "RMSE 1.3e-3, at 288x80 pixels)";
  // diffusers' own tiles (were they used): 256 pixels, >= 64 overlapping.
  info.stock_tile = std::max<int64_t>(1, 256 / info.spatial_factor);
  info.stock_stride = std::max<int64_t>(1, (256 - 64) / info.spatial_factor);
  return info;
}

// Python's t[:, :, start : start + length] along the frame axis.
at::Tensor FrameSlice(const at::Tensor& t, int64_t start, int64_t length) {
  const int64_t size = t.size(2);
  const int64_t begin = std::min(size, start);
  return t.narrow(2, begin, std::max<int64_t>(0, std::min(size, start + length) - begin));
}

// AutoencoderKLMiniMaxH3._blend along frames: b's first frames faded in over
// a's last ones, weights positions / extent in b's dtype.
at::Tensor BlendFrames(const at::Tensor& a, const at::Tensor& b, int64_t extent) {
  extent = std::min({a.size(2), b.size(2), extent});
  if (extent == 0) return b;
  const at::Tensor positions = at::arange(extent, b.options()).view({1, 1, extent, 1, 1});
  const at::Tensor weight_b = positions / static_cast<double>(extent);
  const at::Tensor weight_a = 1 - positions / static_cast<double>(extent);
  const at::Tensor blended = a.narrow(2, a.size(2) - extent, extent) * weight_a + b.narrow(2, 0, extent) * weight_b;
  if (extent == b.size(2)) return blended;
  return at::cat({blended, b.narrow(2, extent, b.size(2) - extent)}, 2);
}

}  // namespace

MiniMaxH3ModuleImpl::MiniMaxH3ModuleImpl(const MiniMaxH3Config& c) {
  decoder = register_module("decoder", ViTDecoder(c));
  post_quant_conv = register_module(
      "post_quant_conv", torch::nn::Conv3d(torch::nn::Conv3dOptions(c.latent_channels, c.latent_channels, 1)));
}

at::Tensor MiniMaxH3ModuleImpl::DecodeWindow(const at::Tensor& z, LayerOps& ops) {
  return decoder->forward(ops.Conv(z, post_quant_conv->weight, post_quant_conv->bias, ConvGeometry{}), ops);
}

MiniMaxH3Decoder::MiniMaxH3Decoder(MiniMaxH3Config config, std::string config_json)
    : ModuleDecoder(MiniMaxH3Module(config), Describe(config, std::move(config_json)), /*latent_halo_rows=*/1),
      config_(std::move(config)) {}

absl::Status MiniMaxH3Decoder::ValidateLatent(const at::Tensor& latent) const {
  RETURN_IF_ERROR(Decoder::ValidateLatent(latent));
  return CheckClipLength(latent.size(2));
}

absl::Status MiniMaxH3Decoder::CheckClipLength(int64_t latent_frames) const {
  if (latent_frames >= info_.min_latent_frames) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("latent has ", latent_frames,
                                                 " frames; AutoencoderKLMiniMaxH3 decodes at least ",
                                                 info_.min_latent_frames, " (fewer make no decode window)"));
}

at::Tensor MiniMaxH3Decoder::ToVaeSpace(const at::Tensor& raw) const {
  const auto opts = at::TensorOptions().dtype(raw.scalar_type()).device(raw.device());
  const int64_t c = config_.latent_channels;
  const at::Tensor mean = at::tensor(config_.latents_mean, at::kDouble).to(opts).view({1, c, 1, 1, 1});
  const at::Tensor std = at::tensor(config_.latents_std, at::kDouble).to(opts).view({1, c, 1, 1, 1});
  return raw * std + mean;
}

namespace {

// A clip decoded a few latent frames at a time through the same windows as
// the whole clip: a window is decoded once its latent frames have all come
// (or, at the clip's end, from the clip padded with copies of its last
// frame), its first part cross-faded with the overlap the window before
// held, its second part held as the next window's overlap. Frames are
// returned as soon as no later latent can change or cut them
// (StreamedFrames); the rest wait in the state.
class WindowStream final : public DecodeStream {
 public:
  WindowStream(const MiniMaxH3Decoder& decoder, MiniMaxH3Module module)
      : decoder_(decoder), config_(decoder.config()), module_(std::move(module)) {}

  using DecodeStream::DecodeChunk;
  at::Tensor DecodeChunk(const at::Tensor& z, LayerOps& ops, bool clip_ends) override {
    at::NoGradGuard no_grad;
    if (ended_) throw StatusError(absl::FailedPreconditionError("the clip has ended: its stream takes no more frames"));
    latents_ = latents_.defined() ? at::cat({latents_, z}, 2) : z;
    seen_ += z.size(2);
    // Every frame returned stays in the clip's output whatever comes next.
    // The chunk's output is allocated once and the frames held from before,
    // then each window's, are copied in as they come (the rest is held): a
    // whole Decode (one chunk) is not held twice by a final concatenation.
    const int64_t due = decoder_.StreamedFrames(seen_, clip_ends) - returned_;
    out_ = FrameOutput(due);
    std::vector<at::Tensor> before = std::move(held_);
    held_.clear();
    for (const at::Tensor& part : before) Hold(part);
    before.clear();  // copied into the output, or held again
    const int64_t chunk = config_.tokens_chunk_size();
    if (clip_ends) {
      const WindowPlan plan = config_.Windows(seen_);
      if (plan.windows == 0) throw StatusError(decoder_.CheckClipLength(seen_));
      if (plan.pad_frames > 0) {
        latents_ =
            at::cat({latents_, latents_.narrow(2, latents_.size(2) - 1, 1).repeat({1, 1, plan.pad_frames, 1, 1})}, 2);
      }
      while (next_window_ < plan.windows) DecodeNextWindow(ops);
      if (overlap_.defined()) Hold(overlap_);
    } else {
      while (next_window_ * chunk + config_.window_latent_frames() <= seen_) DecodeNextWindow(ops);
    }
    if (!out_.full()) throw StatusError(absl::InternalError("a window stream holds fewer frames than are due"));
    at::Tensor out;
    if (due == 0) {
      out = at::empty(
          {z.size(0), config_.out_channels, 0, z.size(3) * config_.patch_size(), z.size(4) * config_.patch_size()},
          z.options().dtype(decoder_.dtype()));
    } else {
      out = out_.Take();
      returned_ += due;
      ops.FramesFinished(out);
    }
    if (clip_ends) {
      ended_ = true;
      latents_ = overlap_ = at::Tensor();
      held_.clear();  // the trimmed pad frames too
    } else {
      // Between chunks the state holds its own frames, not the decoded
      // windows (or chunks) they were cut from, so state_bytes is what it holds.
      Own(latents_);
      Own(overlap_);
      for (at::Tensor& part : held_) Own(part);
    }
    return out;
  }

  int64_t state_bytes() const override {
    int64_t bytes = Bytes(latents_) + Bytes(overlap_);
    for (const at::Tensor& part : held_) bytes += Bytes(part);
    return bytes;
  }
  int64_t latent_frames() const override { return seen_; }

 private:
  // The buffer a tensor keeps alive (a view's whole storage).
  static int64_t Bytes(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0; }
  // A view of a larger buffer (a window's output, a chunk) copied out of it.
  static void Own(at::Tensor& t) {
    if (t.defined() && t.storage().nbytes() > t.nbytes()) t = t.clone(at::MemoryFormat::Contiguous);
  }

  // Final frames, in order: into the chunk's output while it has room, then held.
  void Hold(const at::Tensor& frames) {
    const int64_t n = out_.Add(frames);
    if (n < frames.size(2)) held_.push_back(n > 0 ? frames.narrow(2, n, frames.size(2) - n) : frames);
  }

  // Decodes window next_window_ from the buffered latents (which start at
  // latent frame first_latent_), then drops the latents no later window reads.
  void DecodeNextWindow(LayerOps& ops) {
    const int64_t chunk = config_.tokens_chunk_size();
    const int64_t chunk_frames = chunk * config_.patch_size_t();
    const int64_t pre = config_.frame_pre_padding();
    const at::Tensor window =
        FrameSlice(latents_, next_window_ * chunk - first_latent_, config_.window_latent_frames()).contiguous();
    const at::Tensor clip = module_->DecodeWindow(window, ops);
    // The window's first chunk (after its pre-padding frames) is output; with
    // token_drop its second chunk is the overlap the next window fades in over.
    const at::Tensor first = FrameSlice(FrameSlice(clip, 0, chunk_frames), pre, chunk_frames);
    Hold(overlap_.defined() ? BlendFrames(overlap_, first, config_.frame_overlap()) : first);
    overlap_ = config_.token_drop > 0 ? FrameSlice(FrameSlice(clip, chunk_frames, chunk_frames), pre, chunk_frames)
                                      : at::Tensor();
    ++next_window_;
    // Keep the last latent frame always: the clip's end pads with copies of it.
    const int64_t drop = std::min(next_window_ * chunk, seen_ - 1) - first_latent_;
    if (drop > 0) {
      latents_ = latents_.narrow(2, drop, latents_.size(2) - drop);
      first_latent_ += drop;
    }
  }

  const MiniMaxH3Decoder& decoder_;
  const MiniMaxH3Config& config_;
  MiniMaxH3Module module_;
  at::Tensor latents_;  // latent frames from first_latent_ on (the next windows' inputs)
  int64_t first_latent_ = 0;
  int64_t seen_ = 0;
  int64_t next_window_ = 0;
  at::Tensor overlap_;            // the last window's second part, faded into the next window's first
  std::vector<at::Tensor> held_;  // final frames not yet returned, in order (after out_'s)
  FrameOutput out_;               // during a chunk: the frames it returns
  int64_t returned_ = 0;
  bool ended_ = false;
};

}  // namespace

absl::Status MiniMaxH3Decoder::CheckStreaming() const { return absl::OkStatus(); }

std::unique_ptr<DecodeStream> MiniMaxH3Decoder::OpenStream(const DecodeConditioning&) {
  return std::make_unique<WindowStream>(*this, module_);
}

absl::Status MiniMaxH3Decoder::ValidateChunk(const at::Tensor& latent) const { return Decoder::ValidateLatent(latent); }

int64_t MiniMaxH3Decoder::StreamedFrames(int64_t latent_frames, bool clip_ended) const {
  const int64_t whole = config_.Windows(latent_frames).output_frames;
  if (clip_ended) return whole;
  // The first parts of the windows whose latent frames have all come; of
  // them, no more than any longer clip keeps (its end trims the pad's frames).
  const int64_t chunk = config_.tokens_chunk_size();
  const int64_t window = config_.window_latent_frames();
  const int64_t complete = latent_frames >= window ? (latent_frames - window) / chunk + 1 : 0;
  int64_t frames = complete * std::max<int64_t>(0, chunk * config_.patch_size_t() - config_.frame_pre_padding());
  for (int64_t t = latent_frames; t <= latent_frames + window + 2 * chunk; ++t) {
    frames = std::min(frames, config_.Windows(t).output_frames);
  }
  return frames;
}

at::Tensor MiniMaxH3Decoder::Decode(const at::Tensor& latent, LayerOps& ops) {
  if (config_.Windows(latent.size(2)).windows == 0) throw StatusError(ValidateLatent(latent));
  return OpenStream()->DecodeChunk(latent.to(dtype()), ops, /*clip_ends=*/true);
}

void MiniMaxH3Decoder::ConvertWeights(at::ScalarType dtype) {
  // A parameter is kept when one of its dotted name's parts is listed, as
  // diffusers matches _keep_in_fp32_modules ("encoder" and "quant_conv" are
  // not loaded here).
  static const std::set<std::string> kKeptInFloat32 = {"norm1", "norm2", "norm_out", "scale1", "scale2"};
  torch::NoGradGuard no_grad;
  for (auto& named : module_->named_parameters()) {
    const std::vector<std::string> parts = absl::StrSplit(named.key(), '.');
    const bool kept =
        std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return kKeptInFloat32.count(p) > 0; });
    named.value().set_data(named.value().to(kept ? at::kFloat : dtype));
  }
}

void Register(Registry& registry) {
  // A ViT decoder: transformer blocks and register tokens under decoder.*.
  registry.Register(
      {"minimax_h3",
       {"AutoencoderKLMiniMaxH3"},
       [](const ModelFiles& files, const LoadOptions& options) {
         return LoadModuleDecoder<MiniMaxH3Decoder>(files, options, {{"encoder.", "quant_conv."}, {}});
       },
       {{{"AutoencoderKLMiniMaxH3"}, {{"decoder.register_tokens", 3}, {"decoder.proj_in.weight", 2}}, {}}},
       &LoadMiniMaxH3Encoder});
}

}  // namespace vaedecode::families::minimax_h3
