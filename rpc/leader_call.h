#pragma once

// The server's Run call to a group leader carries an internal.RunRequest
// (proto/vaedecode/internal/worker.proto): the client's DecodeRequest as
// admitted, the mode the scheduler chose and the chunk size, as typed
// fields. What both ends assume of it is here.

#include <cstdint>

namespace vaedecode::rpc {

// The most bytes of data one streamed Chunk carries when RunRequest's
// max_chunk_bytes is 0 (and for the CLI, which streams to itself).
inline constexpr int64_t kDefaultMaxChunkBytes = int64_t{4} << 20;

}  // namespace vaedecode::rpc
