// libFuzzer entry point for what a DecodeSession's messages reach before a
// group does (server/session_requests.h): the open against a model, a chunk
// against the open, and the Decode request the chunk becomes, through the
// Decode's validation and admission. Also linked into
// session_request_corpus_test, which replays the corpus without clang.
//
// Input: one byte choosing the model (server/fuzz_models.h), one the group
// size (1 + byte % 4), two little-endian bytes giving the length of the
// first SessionRequest's bytes (the open), then those bytes, then the
// second SessionRequest's (a chunk or a last_chunk).
//
// Properties beyond "no crash, no sanitizer report": an accepted open plans
// DENSE or EXACT (EXACT only on a group of more than one rank) with its
// state bytes not negative; every refusal has a message; an accepted chunk's
// request carries the session's id and the chunk's latent.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "server/fuzz_models.h"
#include "server/request_validation.h"
#include "server/session_requests.h"
#include "vaedecode/v1/vaedecode.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vaedecode;
  if (size < 4) return 0;
  const v1::ModelInfo& model = server::FuzzModel(data[0]);
  const int group_size = 1 + data[1] % 4;
  const size_t open_bytes = data[2] | (static_cast<size_t>(data[3]) << 8);
  if (4 + open_bytes > size) return 0;
  v1::SessionRequest open_message, chunk_message;
  if (!open_message.ParseFromArray(data + 4, static_cast<int>(open_bytes))) return 0;
  if (!chunk_message.ParseFromArray(data + 4 + open_bytes, static_cast<int>(size - 4 - open_bytes))) return 0;

  server::AdmissionLimits limits;
  limits.max_output_pixels = int64_t{1} << 24;
  const v1::SessionOpen& open = open_message.open();
  absl::StatusOr<server::SessionPlan> plan =
      server::ValidateSessionOpen(open, model, group_size, limits, /*max_chunk_bytes=*/int64_t{1} << 20);
  if (!plan.ok()) {
    server::FuzzRequire(!plan.status().message().empty());
    return 0;
  }
  server::FuzzRequire(plan->mode == v1::MODE_DENSE || (plan->mode == v1::MODE_EXACT && group_size > 1));
  server::FuzzRequire(plan->state_bytes_per_rank >= 0 && !plan->mode_reason.empty());

  const v1::Tensor& chunk = chunk_message.has_last_chunk() ? chunk_message.last_chunk() : chunk_message.chunk();
  const absl::Status fits = server::ValidateSessionChunk(open, chunk);
  if (!fits.ok()) {
    server::FuzzRequire(!fits.message().empty());
    return 0;
  }
  v1::DecodeRequest request = server::SessionChunkRequest(open, plan->mode, 3);
  *request.mutable_latent() = chunk;
  server::FuzzRequire(request.latent().shape(2) >= 1);
  absl::Status status = server::ValidateDecodeRequest(request, model);
  if (status.ok()) status = server::CheckAdmission(request, model, limits);
  if (!status.ok()) server::FuzzRequire(!status.message().empty());
  return 0;
}
