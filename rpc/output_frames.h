#pragma once

// How many frames a video decoder outputs for T latent frames, in a form the
// worker can hand the server (torch-free: the frontend predicts output sizes
// for admission limits and memory plans without a decoder).
//
// Causal video VAEs output 1 + temporal_factor·(T − 1). Decoders whose
// temporal windows break that formula (MiniMax-H3's cross-faded clips) give
// a table for short latents and a period beyond it.

#include <cstdint>
#include <vector>

namespace vaedecode::rpc {

struct OutputFrameTable {
  // frames[T] for T < frames.size(); empty: the causal formula.
  std::vector<int64_t> frames;
  // Beyond the table F(T) = F(T − period) + frames_per_period.
  int64_t period = 0;
  int64_t frames_per_period = 0;
};

// Output frames for `latent_frames` (>= 0) latent frames.
int64_t OutputFrames(const OutputFrameTable& table, int64_t temporal_factor, int64_t latent_frames);

}  // namespace vaedecode::rpc
