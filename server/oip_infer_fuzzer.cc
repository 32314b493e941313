// libFuzzer entry point for the Open Inference Protocol's ModelInfer request
// as a client sends it: the serialized ModelInferRequest, its translation to
// a DecodeRequest (server/oip_translation.h), then the server's validation
// and admission checks. Also linked into oip_infer_corpus_test, which
// replays the corpus without clang.
//
// Input: one byte choosing the model (server/fuzz_models.h), then the
// request's protobuf bytes.
//
// Properties beyond "no crash, no sanitizer report": an accepted request's
// latent holds exactly numel x element size bytes and carries the request's
// id; every refusal has a message.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "inference/grpc_predict_v2.pb.h"
#include "rpc/latent_tensor.h"
#include "rpc/request_checks.h"
#include "server/fuzz_models.h"
#include "server/oip_translation.h"
#include "server/request_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vaedecode;
  if (size < 1) return 0;
  const v1::ModelInfo& model = server::FuzzModel(data[0]);
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;

  // The same request read as an encode (its "operation" parameter aside).
  (void)server::OperationOf(request);
  absl::StatusOr<v1::EncodeRequest> encode = server::TranslateModelInferEncode(request, model);
  if (encode.ok()) {
    server::FuzzRequire(encode->request_id() == request.id());
    server::AdmissionLimits limits;
    limits.max_output_pixels = int64_t{1} << 24;
    const absl::Status valid = server::ValidateEncodeRequest(*encode, model, /*group_size=*/2, limits);
    server::FuzzRequire(valid.ok() || !valid.message().empty());
  } else {
    server::FuzzRequire(!encode.status().message().empty());
  }
  absl::StatusOr<v1::DecodeRequest> decode = server::TranslateModelInfer(request, model);
  absl::Status status = decode.status();
  if (decode.ok()) {
    server::FuzzRequire(decode->request_id() == request.id());
    status = server::ValidateDecodeRequest(*decode, model);
    if (status.ok()) {
      const absl::StatusOr<int64_t> numel = rpc::CountLatentElements(decode->latent());
      server::FuzzRequire(numel.ok());
      server::FuzzRequire(static_cast<int64_t>(decode->latent().data().size()) ==
                          *numel * rpc::DTypeSize(decode->latent().dtype()).value());
      server::AdmissionLimits limits;
      limits.max_output_pixels = int64_t{1} << 24;
      status = server::CheckAdmission(*decode, model, limits);
      if (status.ok() && rpc::HasMuxedAudio(*decode)) {
        status = server::ValidateMuxedAudio(*decode, server::FuzzModelNamed(decode->audio_model()), limits);
      }
      server::FuzzRequire(server::PredictTensorOutputBytes(*decode, model) >= 0);
    }
  }
  if (!status.ok()) server::FuzzRequire(!status.message().empty());
  return 0;
}
