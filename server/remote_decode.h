#pragma once

// diffusers' remote_decode() protocol (diffusers.utils.remote_utils), as
// pure translations between its HTTP request/reply and vaedecode.v1, so the
// HTTP endpoint (server/http_endpoint.h) only moves bytes.
//
// Request: POST with the raw little-endian latent as the body and query
// parameters shape (repeated), dtype (float16, bfloat16, float32),
// output_type (pil, pt, mp4), image_format (jpg, png), partial_postprocess,
// scaling_factor / shift_factor (the latent is raw: z / s + shift), or
// do_scaling=True (raw, the model's own formula); height and width in
// pixels for packed latents: FLUX.1's [B, (H/16)·(W/16), 4C] 2x2 patches,
// FLUX.2's [B, (H/16)·(W/16), 128] flattened raw latent. Extensions:
// latent_space (vae, raw), mode (auto, dense, exact, tiled), jpeg_quality,
// png_compression (0..9), fps (MP4), decode_timestep / decode_noise_scale / noise_seed (LTX),
// output_dtype (pt: float32, float16); audio VAEs: audio_output (waveform,
// mel), output_type wav with wav_encoding (pcm16, float32); mp4 with an
// audio track: audio_model, audio_shape (repeated), audio_latent_space, the
// audio latent's bytes (in `dtype`) following the latent's in the body.
//
// Replies (what postprocess_decode reads):
//   pil, image model     one JPEG/PNG file (batch 1)
//   pil, video model     float32 [B·T, C, H, W] in [0, 1] (the processor path)
//   pt                   float32 (or output_dtype) [B, C, H, W] / [B, C, T, H, W] in [-1, 1]
//   pt + partial_postprocess  uint8 [B, H, W, C] (video: [B·T, H, W, C])
//   mp4, video model     one H.264 MP4 file (batch 1; fps settable)
//   pt, audio VAE        float32 (or output_dtype) waveform [B, channels, samples]
//                        (mel spectrogram [B, C, frames, bins] with audio_output=mel)
//   wav, audio VAE       one WAV file (batch 1), the default for audio VAEs
// A waveform's replies carry its rate in X-Vaedecode-Sample-Rate.
// tensors with `shape` (a JSON list) and `dtype` headers; errors as
// {"error": "..."} with an HTTP status from the absl code.
//
// Thread-safe: pure functions.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/collected_output.h"
#include "server/http_query.h"
#include "server/http_reply.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// What the reply must be made of, decided from the request.
enum class RemoteReply {
  kImageFile,    // pil on an image model: the encoded image
  kVideoFrames,  // pil on a video model: [0, 1] float frames
  kTensor,       // pt: the decoder output
  kPixels,       // pt + partial_postprocess: uint8 channels-last
  kVideoFile,    // mp4 on a video model: the MP4 file
  kAudioFile,    // wav on an audio VAE: the WAV file
};

struct RemoteDecodeCall {
  v1::DecodeRequest request;
  RemoteReply reply = RemoteReply::kImageFile;
};

// The DecodeRequest a remote_decode POST asks for, for `model`. `body` is
// moved into the latent (a packed latent is unpacked: one copy).
// INVALID_ARGUMENT naming the parameter when one is missing or malformed;
// size and content checks are left to ValidateDecodeRequest.
absl::StatusOr<RemoteDecodeCall> TranslateRemoteDecode(const QueryParams& params, std::string body,
                                                       const v1::ModelInfo& model);

// How a packed latent [B, tokens, channels] lays out the latent it packs.
enum class Packing {
  // FluxPipeline._pack_latents: 2x2 patches of C latent channels, token
  // i·(w/2) + j holding channel c's (di, dj) at 4c + 2di + dj. Unpacks to
  // [B, C, h, w] (also FLUX.2's VAE-space latent: the same scatter is its
  // unpack followed by _unpatchify_latents).
  kPatches2x2,
  // Flux2Pipeline._pack_latents: the raw latent [B, C, h, w] flattened,
  // token i·w + j holding every channel. Unpacks to [B, C, h, w].
  kFlatten,
};

// The latent a packed latent `packed_shape` = [B, tokens, channels] holds
// for a height x width image, as diffusers unpacks it; each token covers
// `token_pixels` x `token_pixels` pixels (16 for FLUX.1 and FLUX.2), so
// tokens = (height / token_pixels) · (width / token_pixels). `packed` holds
// B · tokens · channels elements of `element_size` bytes. Every size is
// checked before anything is read (no product overflows): INVALID_ARGUMENT
// naming the parameter when they do not agree.
absl::StatusOr<std::string> UnpackPackedLatent(const std::string& packed, int64_t element_size,
                                               const std::vector<int64_t>& packed_shape, int64_t height, int64_t width,
                                               int64_t token_pixels, Packing packing,
                                               std::vector<int64_t>* unpacked_shape);

// The reply for a finished decode (an error reply when it failed).
HttpReply BuildRemoteDecodeReply(RemoteReply kind, CollectedOutput output);

}  // namespace vaedecode::server
