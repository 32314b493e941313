#pragma once

// What the server tells a group leader beside the DecodeRequest of a Run
// call (proto/vaedecode/internal/worker.proto), as call metadata: the
// request itself travels as the client sent it, never copied to be edited.

#include <cstdint>

namespace vaedecode::rpc {

// The most bytes of data one streamed Chunk carries.
inline constexpr const char* kMaxChunkBytesKey = "x-max-chunk-bytes";
inline constexpr int64_t kDefaultMaxChunkBytes = int64_t{4} << 20;

// The mode the scheduler chose (server/mode_selection.h), as the v1::Mode
// number: DENSE, EXACT or TILED. Without it the leader takes the
// request's own mode.
inline constexpr const char* kDecodeModeKey = "x-decode-mode";

}  // namespace vaedecode::rpc
