// libFuzzer entry point for the OIP HTTP/REST binding's infer request: the
// JSON header and binary tensors (server/oip_rest.h), the translation to a
// DecodeRequest, the server's validation and admission checks, then the
// reply built from a response shaped like the request. Also linked into
// oip_rest_corpus_test, which replays the corpus without clang.
//
// Input: one byte choosing the model (server/fuzz_models.h), 4 bytes of
// Inference-Header-Content-Length (little-endian; 0xffffffff: absent), then
// the POST body.
//
// Properties beyond "no crash, no sanitizer report, no exception" (an
// escaping nlohmann exception aborts): an accepted request holds one raw
// tensor per input; every refusal has a message.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rpc/latent_tensor.h"
#include "rpc/request_checks.h"
#include "server/fuzz_models.h"
#include "server/oip_rest.h"
#include "server/oip_translation.h"
#include "server/request_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vaedecode;
  if (size < 5) return 0;
  const v1::ModelInfo& model = server::FuzzModel(data[0]);
  uint32_t length = 0;
  std::memcpy(&length, data + 1, 4);
  const std::string body(reinterpret_cast<const char*>(data + 5), size - 5);
  absl::StatusOr<server::RestInferRequest> parsed =
      server::ParseRestInferRequest(body, length == 0xffffffffu ? -1 : static_cast<int64_t>(length), model.name(), "");
  if (!parsed.ok()) {
    server::FuzzRequire(!parsed.status().message().empty());
    return 0;
  }
  server::FuzzRequire(parsed->request.raw_input_contents_size() == parsed->request.inputs_size());
  // The same request read as an encode (its "operation" parameter aside).
  (void)server::OperationOf(parsed->request);
  absl::StatusOr<v1::EncodeRequest> encode = server::TranslateModelInferEncode(parsed->request, model);
  if (encode.ok()) {
    server::FuzzRequire(encode->request_id() == parsed->request.id());
    server::AdmissionLimits limits;
    limits.max_output_pixels = int64_t{1} << 24;
    const absl::Status valid = server::ValidateEncodeRequest(*encode, model, /*group_size=*/2, limits);
    server::FuzzRequire(valid.ok() || !valid.message().empty());
  } else {
    server::FuzzRequire(!encode.status().message().empty());
  }
  absl::StatusOr<v1::DecodeRequest> decode = server::TranslateModelInfer(parsed->request, model);
  absl::Status status = decode.status();
  if (decode.ok()) {
    status = server::ValidateDecodeRequest(*decode, model);
    if (status.ok()) {
      server::AdmissionLimits limits;
      limits.max_output_pixels = int64_t{1} << 24;
      status = server::CheckAdmission(*decode, model, limits);
      if (status.ok() && rpc::HasMuxedAudio(*decode)) {
        status = server::ValidateMuxedAudio(*decode, server::FuzzModelNamed(decode->audio_model()), limits);
      }
    }
  }
  if (!status.ok()) server::FuzzRequire(!status.message().empty());

  // The reply side, on an output shaped like the request's latent.
  inference::ModelInferResponse response;
  response.set_model_name(model.name());
  response.set_id(parsed->request.id());
  auto* out = response.add_outputs();
  out->set_name("sample");
  const auto& input = parsed->request.inputs(0);
  out->set_datatype(input.datatype());
  for (int64_t d : input.shape()) out->add_shape(d);
  response.add_raw_output_contents(parsed->request.raw_input_contents(0));
  for (const auto& [name, value] : parsed->request.parameters()) (*response.mutable_parameters())[name] = value;
  (void)server::BuildRestInferReply(response, parsed->binary_output);
  (void)server::BuildRestInferReply(response, !parsed->binary_output);
  return 0;
}
