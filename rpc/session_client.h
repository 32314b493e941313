#pragma once

// The client's side of one DecodeSession call, written once for
// vaedecode_client's session mode and the service tests: the open, then a
// latent sent in chunks (each once the one before has its ChunkTrailer, so
// the server never holds more than one), the last as the clip's
// last_chunk (which ends the session), every answer read into a
// SessionAssembler.
//
// Threading: one call per thread; the callbacks run on the calling thread.

#include <cstdint>
#include <functional>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "rpc/session_stream.h"
#include "vaedecode/v1/vaedecode.grpc.pb.h"

namespace vaedecode::rpc {

struct SessionCallbacks {
  // Every message, as it arrives (before the next chunk is sent).
  std::function<void(const v1::DecodeResponse&)> on_message;
  // Chunk i has its trailer; runs before chunk i + 1 is sent.
  std::function<void(int64_t)> after_chunk;
};

struct SessionCall {
  grpc::Status status;  // the call's
  // The first protocol error in the answers (the call is then CANCELLED:
  // report this one first), or Finish()'s.
  absl::Status stream_error;
  SessionAssembler stream;  // the answers; its clip() assembled when both are OK
};

// Runs the session on `ctx` (its deadline and options the caller's): sends
// `open`, then frames [sum of chunks before i, + chunks[i]) of the C-order
// [B, C, T, H, W] `latent` as chunk i (the last as last_chunk), and reads
// to the end.
// A protocol error in the answers cancels the call.
SessionCall RunDecodeSession(v1::VaeDecoder::Stub& stub, grpc::ClientContext& ctx, const v1::SessionOpen& open,
                             const v1::Tensor& latent, const std::vector<int64_t>& chunks,
                             const SessionCallbacks& callbacks = {});

}  // namespace vaedecode::rpc
