#pragma once

// Both ends of a DecodeSession stream as its client sees them: the requests
// that send a whole latent chunk by chunk, and SessionAssembler, which
// reassembles the answers (SessionHeader; per chunk its Chunks and a
// ChunkTrailer; a final Trailer) into the whole clip as a Decode of it would
// have been assembled: the frames are checked to arrive chunk by chunk in
// order, then replayed into an OutputAssembler under a Header made from the
// session's (its frames the session's total). For vaedecode_client's
// session mode, the CLI's --stream-chunks and the tests alike. No torch.
//
// Threading: one thread at a time.

#include <cstdint>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/output_assembler.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::rpc {

// "1,2,2": latent frames per chunk, positive, adding up to `latent_frames`;
// INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<std::vector<int64_t>> ParseStreamChunks(absl::string_view flag, absl::string_view text,
                                                       int64_t latent_frames);

// The SessionOpen that decodes `whole` (a Decode's request for a video
// latent [B, C, T, H, W]) chunk by chunk: its model, options and mode, its
// latent's shape without T; its request_id as the session id.
// INVALID_ARGUMENT for what a session does not take: a decode timestep or
// noise other than 0 (a session decodes at the default timestep, without
// noise).
absl::StatusOr<v1::SessionOpen> SessionOpenFor(const v1::DecodeRequest& whole);

// Frames [begin, begin + count) of a C-order [B, C, T, H, W] latent.
v1::Tensor LatentFrames(const v1::Tensor& latent, int64_t begin, int64_t count);

class SessionAssembler {
 public:
  // Takes the next message of the stream. INVALID_ARGUMENT when it breaks
  // the protocol.
  absl::Status Add(const v1::DecodeResponse& message);
  // The stream ended: the final trailer must have come; assembles the clip.
  absl::Status Finish();

  bool has_header() const { return has_header_; }
  const v1::SessionHeader& header() const { return header_; }
  const std::vector<v1::ChunkTrailer>& chunk_trailers() const { return chunk_trailers_; }
  const v1::Trailer& trailer() const { return trailer_; }
  // After Finish: the clip, assembled.
  OutputAssembler& clip() { return clip_; }

 private:
  bool has_header_ = false;
  bool has_trailer_ = false;
  v1::SessionHeader header_;
  std::vector<v1::Chunk> chunks_;  // every chunk so far, frames numbered in the clip
  std::vector<v1::ChunkTrailer> chunk_trailers_;
  v1::Trailer trailer_;
  int64_t frames_ = 0;           // output frames the chunk trailers account for
  int64_t frames_in_chunk_ = 0;  // the largest frame + 1 seen since the last chunk trailer
  OutputAssembler clip_;
};

}  // namespace vaedecode::rpc
