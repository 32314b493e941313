#pragma once

// The seam between a family's decoder and how its layers execute.
//
// A decoder's blocks never call at::conv2d / at::group_norm / attention
// directly for the ops whose result depends on neighbouring rows; they call a
// LayerOps. DenseOps runs the original op on the whole tensor; a sharded
// implementation (families/sharded_layer_ops.h) runs the same op on a row band with
// halo exchange, merged statistics or gathered K/V. Because the same modules and
// parameters are used either way, a sharded decode cannot drift from dense.
//
// Pointwise ops, channel-only norms and nearest upsampling stay in the blocks:
// they are local under any row partition.

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>

#include <ATen/core/Tensor.h>

namespace vaedecode::families {

enum class PaddingMode { kZeros, kReplicate, kReflect, kCircular };

// Geometry of a stride-1 convolution (decoders have no strided convs).
// Spatial padding is symmetric; `padding_t` is symmetric temporal padding that
// the conv applies itself (causal temporal padding is done by the block).
struct ConvGeometry {
  int64_t padding_t = 0;
  int64_t padding_h = 0;
  int64_t padding_w = 0;
  int64_t dilation = 1;
  PaddingMode mode = PaddingMode::kZeros;
};

// Geometry of a strided convolution (an encoder's downsampler): stride
// `stride` in H and W (1 in T), the rows padded `pad_top` above and
// `pad_bottom` below and the columns `pad_left` / `pad_right`, all with
// `mode`; a 5-D weight's frames get `padding_t` on both sides. diffusers'
// Downsample2D(padding=0) is {stride 2, pads (0, 1, 0, 1), zeros}.
struct StridedConvGeometry {
  int64_t stride = 2;
  int64_t stride_t = 1;  // a 5-D weight's stride in time (time is never sharded)
  int64_t pad_top = 0;
  int64_t pad_bottom = 0;
  int64_t pad_left = 0;
  int64_t pad_right = 0;
  int64_t padding_t = 0;
  PaddingMode mode = PaddingMode::kZeros;

  // Output rows of `rows` input rows under a kernel `kernel` rows tall.
  int64_t OutputRows(int64_t rows, int64_t kernel) const { return (rows + pad_top + pad_bottom - kernel) / stride + 1; }
};

// Where a tensor's rows sit in the whole (unsharded) tensor, at its own
// resolution: the first row this rank holds and the rows of all ranks.
struct RowWindow {
  int64_t first = 0;
  int64_t total = 0;
};

// How an attention's tokens lie, so that each LayerOps knows which keys a
// query sees and what a rank holds.
struct TokenLayout {
  enum class Kind {
    // q, k, v: [B, heads, N + shared_tokens, D]: every query against every
    // key. Per-image attention, and per-frame attention with frames folded
    // into B (Wan).
    kFull,
    // q, k, v: [B, heads, T, N, D]: query frame t against every key of
    // frames 0..t, all rows (HunyuanVideo's mid block: the global mask "0
    // where key frame <= query frame, -inf elsewhere", never materialised).
    kFrameCausal,
  };
  Kind kind = Kind::kFull;
  // N enumerates tokens row-major (within each frame for kFrameCausal), so
  // a row band's tokens are contiguous; `tokens_per_row` tokens make one row
  // of the sharded axis (W).
  int64_t tokens_per_row = 1;
  // kFrameCausal only: the keys hold this many frames before the queries'
  // first (a stream's earlier frames): query frame t is frame
  // key_frames_before + t of the keys, against keys 0..key_frames_before + t.
  int64_t key_frames_before = 0;
  // kFrameCausal only: k and v already hold every rank's rows
  // (LayerOps::GatherKeysValues, a stream's keys kept gathered), so no op
  // gathers them again.
  bool keys_gathered = false;
  // kFull only: the last `shared_tokens` tokens are held alike by every rank
  // (a ViT's register and CLS tokens). Every rank computes all its queries,
  // the shared ones included, against every band's keys plus the shared keys
  // once (no duplicate keys), so the shared tokens stay equal on every rank.
  int64_t shared_tokens = 0;

  static TokenLayout Full(int64_t tokens_per_row, int64_t shared_tokens = 0) {
    return {Kind::kFull, tokens_per_row, 0, false, shared_tokens};
  }
  static TokenLayout FrameCausal(int64_t tokens_per_row, int64_t key_frames_before = 0, bool keys_gathered = false) {
    return {Kind::kFrameCausal, tokens_per_row, key_frames_before, keys_gathered, 0};
  }
};

class LayerOps {
 public:
  virtual ~LayerOps() = default;

  // The window of a tensor that holds `local_rows` rows of the sharded axis
  // (for positional encodings in global coordinates). The default is right
  // for ops that hold whole tensors: {0, local_rows}.
  virtual RowWindow GlobalRows(int64_t local_rows) { return {0, local_rows}; }

  // x: [B, C, H, W] with a 4-D weight, or [B, C, T, H, W] with a 5-D weight.
  // Height is the sharded axis.
  virtual at::Tensor Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const ConvGeometry& geometry) = 0;

  // x: [B, C, ...]; statistics over each group's channels and all of `...`.
  virtual at::Tensor GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight,
                               const at::Tensor& bias, double eps) = 0;

  // A strided convolution (StridedConvGeometry), x as for Conv. The default
  // is right for ops that hold whole tensors: the dense op.
  virtual at::Tensor StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const StridedConvGeometry& geometry);

  // softmax(q·kᵀ/√D)·v for the local queries against every key of the
  // (global) sequence, its tokens laid out as `layout` says (TokenLayout).
  virtual at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const TokenLayout& layout) = 0;

  // k, v: [B, heads, T, N, D] with this rank's rows of tokens (`tokens_per_row`
  // a row) -> every rank's, for an attention to keep (a stream's keys and
  // values of earlier frames: gathered once, not again with every chunk).
  // The default is right for ops that hold whole tensors: k and v.
  virtual std::pair<at::Tensor, at::Tensor> GatherKeysValues(const at::Tensor& k, const at::Tensor& v,
                                                             int64_t tokens_per_row) {
    (void)tokens_per_row;
    return {k, v};
  }

  // Whether this rank holds a band of rows and the layers exchange rows with
  // other ranks (ShardedLayerOps), so that every layer call costs
  // collectives: a stream then decodes a chunk's frames in one pass, where
  // whole tensors go a latent frame at a time (DecodeStream).
  virtual bool HoldsRowBand() const { return false; }

  // The decode's final output for its next frames ([B, C, t, H, W], this
  // rank's rows; in order, each call continuing the last), from a decoder
  // that finishes frames before the clip ends (Wan's causal chunks), so the
  // caller can stream them while later frames decode. Ignored unless a
  // caller decorates the ops to take them (worker/exact_decode.cc).
  virtual void FramesFinished(const at::Tensor& frames) { (void)frames; }
};

// LayerOps that pass every op to `inner`: a decorator overrides only the
// ops it changes (a new op is one forwarding method here).
class ForwardingOps : public LayerOps {
 public:
  explicit ForwardingOps(LayerOps& inner) : inner_(inner) {}
  at::Tensor Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvGeometry& geometry) override {
    return inner_.Conv(x, weight, bias, geometry);
  }
  at::Tensor GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) override {
    return inner_.GroupNorm(x, num_groups, weight, bias, eps);
  }
  at::Tensor StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const StridedConvGeometry& geometry) override {
    return inner_.StridedConv(x, weight, bias, geometry);
  }
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override {
    return inner_.Attention(q, k, v, layout);
  }
  RowWindow GlobalRows(int64_t local_rows) override { return inner_.GlobalRows(local_rows); }
  std::pair<at::Tensor, at::Tensor> GatherKeysValues(const at::Tensor& k, const at::Tensor& v,
                                                     int64_t tokens_per_row) override {
    return inner_.GatherKeysValues(k, v, tokens_per_row);
  }
  bool HoldsRowBand() const override { return inner_.HoldsRowBand(); }
  void FramesFinished(const at::Tensor& frames) override { inner_.FramesFinished(frames); }

 protected:
  LayerOps& inner() { return inner_; }

 private:
  LayerOps& inner_;
};

// Output (or im2col column) elements one convolution call makes on a CPU
// before the next band: a CPU convolution without a direct kernel holds
// im2col columns for the whole call (in channels × kernel volume per output
// position), so one large call peaks far above its output.
inline constexpr int64_t kConvOutputsPerBand = int64_t{1} << 23;

// A same-padded stride-1 convolution of `x` whose rows get `pad_top` and
// `pad_bottom` rows of `geometry.mode` padding (0 where the caller provided
// neighbour rows), computed on a CPU past kConvOutputsPerBand outputs sample
// by sample and in bands of output rows, each reading only the rows it needs
// (`between` runs before every call but the first: a cancellation check).
// Same values as one call up to float rounding; GPUs take one call.
// The original, unsharded ops. Stateless; one instance may be shared.
class DenseOps final : public LayerOps {
 public:
  at::Tensor Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvGeometry& geometry) override;
  at::Tensor GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) override;
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override;
};

// DenseOps that stop with StatusError(CANCELLED) at the first op after
// *cancelled becomes true; a long attention is checked between chunks of
// queries, a large convolution between samples and bands of rows (same
// values up to float rounding: each chunk computes its outputs from the
// same inputs).
class CancellableDenseOps final : public LayerOps {
 public:
  // Query × key scores (times batch × heads) one attention call computes
  // before the next cancellation check: a few tenths of a second on a CPU.
  static constexpr int64_t kScoresPerCall = int64_t{1} << 24;
  // Output elements one convolution call computes before the next check.
  static constexpr int64_t kConvOutputsPerCall = kConvOutputsPerBand;

  explicit CancellableDenseOps(const std::atomic<bool>* cancelled) : cancelled_(cancelled) {}
  at::Tensor Conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const ConvGeometry& geometry) override;
  at::Tensor GroupNorm(const at::Tensor& x, int64_t num_groups, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) override;
  at::Tensor StridedConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const StridedConvGeometry& geometry) override;
  // Frame-causal attention goes frame by frame (the same per-frame calls as
  // FrameCausalScaledDotProductAttention), each chunked and checked.
  at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const TokenLayout& layout) override;

 private:
  void CheckCancelled() const;
  at::Tensor ChunkedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  const std::atomic<bool>* cancelled_;
  DenseOps dense_;
};

// Building blocks shared by DenseOps and the sharded ops, so both compute
// bit-for-bit the same arithmetic on the same rows.

// Pads only W (and T) with the geometry's mode, then convolves with zero
// H padding: the caller has already provided the rows above and below.
at::Tensor ConvWithRowsProvided(const at::Tensor& x_with_rows, const at::Tensor& weight, const at::Tensor& bias,
                                const ConvGeometry& geometry);

// A convolution of `x` whose rows get `top` and `bottom` rows of
// `geometry.mode` padding (0 where the caller provided neighbour rows) and
// whose W (and T, for a 5-D weight) get the geometry's padding: zeros by the
// convolution itself, replicate and reflect by one padded copy (PadForConv).
at::Tensor ConvWithRowPadding(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const ConvGeometry& geometry, int64_t top, int64_t bottom);

// `x` ([B, C, H, W] or [B, C, T, H, W]) padded in one copy with the
// geometry's mode: H by `top` and `bottom`, W by geometry.padding_w, and T
// by geometry.padding_t when `temporal`.
at::Tensor PadForConv(const at::Tensor& x, int64_t top, int64_t bottom, const ConvGeometry& geometry, bool temporal);

at::Tensor ConvInRowBands(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const ConvGeometry& geometry, int64_t pad_top, int64_t pad_bottom,
                          const std::function<void()>& between = nullptr);

// The strided convolution of `x` whose rows get `top` and `bottom` rows of
// `geometry.mode` padding (the sharded op passes 0 where it provided
// neighbour rows) and whose columns (and frames) get the geometry's.
at::Tensor StridedConvWithRowPadding(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                     const StridedConvGeometry& geometry, int64_t top, int64_t bottom);

// softmax(q·kᵀ/√d)·v, diffusers' F.scaled_dot_product_attention (no mask).
at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Frame-causal attention of q [B, heads, T, Nq, D] against every frame's keys
// k, v [B, heads, T, Nk, D]: query frame t against the (t+1)·Nk keys of
// frames 0..t, each through ScaledDotProductAttention. Equal to diffusers'
// softmax(q·kᵀ·scale + mask)·v over all T·Nk keys up to rounding: masked keys
// contribute exp(-inf) = 0 there.
// Throws unless q, k, v are frame-causal attention's [B, heads, T, N, D]
// with `key_frames_before` more key (and value) frames than query frames.
void CheckFrameCausalShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t key_frames_before);

// With `key_frames_before`, the keys hold that many frames before the
// queries' first (TokenLayout::key_frames_before).
at::Tensor FrameCausalScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                int64_t key_frames_before = 0);

}  // namespace vaedecode::families
