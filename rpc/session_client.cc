#include "rpc/session_client.h"

namespace vaedecode::rpc {

SessionCall RunDecodeSession(v1::VaeDecoder::Stub& stub, grpc::ClientContext& ctx, const v1::SessionOpen& open,
                             const v1::Tensor& latent, const std::vector<int64_t>& chunks,
                             const SessionCallbacks& callbacks) {
  SessionCall out;
  auto call = stub.DecodeSession(&ctx);
  // Reads up to the next message of `kind`; false when the stream ended.
  const auto read_until = [&](v1::DecodeResponse::KindCase kind) {
    v1::DecodeResponse message;
    while (call->Read(&message)) {
      if (out.stream_error.ok()) {
        out.stream_error = out.stream.Add(message);
        if (!out.stream_error.ok()) ctx.TryCancel();
      }
      if (callbacks.on_message) callbacks.on_message(message);
      if (message.kind_case() == kind) return true;
    }
    return false;
  };
  v1::SessionRequest first;
  *first.mutable_open() = open;
  bool going = call->Write(first) && read_until(v1::DecodeResponse::kSessionHeader);
  int64_t begin = 0;
  for (size_t i = 0; going && i < chunks.size(); ++i) {
    // The last chunk says the clip ends (a model may hold frames for it) and ends the session.
    v1::SessionRequest chunk;
    *(i + 1 == chunks.size() ? chunk.mutable_last_chunk() : chunk.mutable_chunk()) =
        LatentFrames(latent, begin, chunks[i]);
    begin += chunks[i];
    going = call->Write(chunk) && read_until(v1::DecodeResponse::kChunkTrailer);
    if (going && callbacks.after_chunk) callbacks.after_chunk(static_cast<int64_t>(i));
  }
  call->WritesDone();
  read_until(v1::DecodeResponse::KIND_NOT_SET);  // the rest of the stream
  out.status = call->Finish();
  if (out.status.ok() && out.stream_error.ok()) out.stream_error = out.stream.Finish();
  return out;
}

}  // namespace vaedecode::rpc
