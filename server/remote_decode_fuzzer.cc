// libFuzzer entry point for everything a remote_decode or remote_encode POST
// reaches before a group does: the query string (server/http_query.h), the
// translations (server/remote_decode.h with its packed-latent unpack,
// server/remote_encode.h), then the server's validation and admission
// checks and the JSON error reply; each input goes through both. Also linked into
// remote_decode_corpus_test, which replays the corpus without clang.
//
// Input: one byte choosing the model (server/fuzz_models.h), the request
// target up to the first '\n' ("/models/m?shape=1&..."), then the body.
//
// Properties beyond "no crash, no sanitizer report": an accepted request's
// latent holds exactly numel x element size bytes, an accepted encode one
// image; every refusal has a
// message; the error reply is valid JSON whatever the message holds.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rpc/latent_tensor.h"
#include "rpc/request_checks.h"
#include "server/fuzz_models.h"
#include "server/http_query.h"
#include "server/remote_decode.h"
#include "server/remote_encode.h"
#include "server/request_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vaedecode;
  if (size < 1) return 0;
  const v1::ModelInfo& model = server::FuzzModel(data[0]);
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t newline = rest.find('\n');
  const std::string target = rest.substr(0, newline);
  std::string body = newline == std::string::npos ? std::string() : rest.substr(newline + 1);

  const server::QueryParams params = server::ParseQuery(target);
  absl::StatusOr<server::RemoteEncodeCall> encode = server::TranslateRemoteEncode(params, body, model);
  absl::Status encode_status = encode.status();
  if (encode.ok()) {
    server::AdmissionLimits limits;
    limits.max_output_pixels = int64_t{1} << 24;
    encode_status = server::ValidateEncodeRequest(encode->request, model, /*group_size=*/2, limits);
    // An accepted encode has its image in exactly one form.
    const bool file = !encode->request.encoded_image().empty();
    server::FuzzRequire(!encode_status.ok() || encode->request.has_image() != file);
  }
  if (!encode_status.ok()) server::FuzzRequire(!encode_status.message().empty());

  absl::StatusOr<server::RemoteDecodeCall> call = server::TranslateRemoteDecode(params, std::move(body), model);
  absl::Status status = call.status();
  if (call.ok()) {
    const v1::DecodeRequest& request = call->request;
    status = server::ValidateDecodeRequest(request, model);
    if (status.ok()) {
      const absl::StatusOr<int64_t> numel = rpc::CountLatentElements(request.latent());
      server::FuzzRequire(numel.ok());
      server::FuzzRequire(static_cast<int64_t>(request.latent().data().size()) ==
                          *numel * rpc::DTypeSize(request.latent().dtype()).value());
      server::AdmissionLimits limits;
      limits.max_output_pixels = int64_t{1} << 24;
      status = server::CheckAdmission(request, model, limits);
      if (status.ok() && rpc::HasMuxedAudio(request)) {
        status = server::ValidateMuxedAudio(request, server::FuzzModelNamed(request.audio_model()), limits);
      }
      server::FuzzRequire(server::PredictTensorOutputBytes(request, model) >= 0);
    }
  }
  if (!status.ok()) {
    server::FuzzRequire(!status.message().empty());
    const server::HttpReply reply = server::ErrorReply(status);
    server::FuzzRequire(reply.status >= 400 && reply.body.size() > 2 && reply.body.front() == '{' &&
                        reply.body.back() == '}');
  }
  return 0;
}
