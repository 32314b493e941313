#include "server/remote_encode.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rpc/request_options.h"
#include "rpc/status_macros.h"

namespace vaedecode::server {
namespace {

// A finite number, or why not.
absl::StatusOr<std::optional<double>> OptionalNumber(const QueryParams& params, const std::string& name) {
  ASSIGN_OR_RETURN(const std::string* text, SingleQueryParam(params, name));
  if (text == nullptr) return std::nullopt;
  double v = 0;
  if (!absl::SimpleAtod(*text, &v) || !std::isfinite(v)) {
    return BadQueryParam(name, absl::StrCat("\"", *text, "\" is not a finite number"));
  }
  return v;
}

}  // namespace

absl::StatusOr<RemoteEncodeCall> TranslateRemoteEncode(const QueryParams& params, std::string body,
                                                       const v1::ModelInfo& model) {
  RemoteEncodeCall call;
  v1::EncodeRequest& r = call.request;
  r.set_model(model.name());

  for (const rpc::OptionInfo& option : rpc::EncodeOptions()) {
    if ((option.surfaces & rpc::kHttp) == 0) continue;
    ASSIGN_OR_RETURN(const std::string* value, SingleQueryParam(params, option.name));
    if (value == nullptr) continue;
    if (absl::Status s = rpc::SetOption(option, *value, r); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("query parameter ", s.message()));
    }
  }
  ASSIGN_OR_RETURN(call.scaling_factor, OptionalNumber(params, "scaling_factor"));
  ASSIGN_OR_RETURN(call.shift_factor, OptionalNumber(params, "shift_factor"));
  if (call.scaling_factor || call.shift_factor) {
    if (r.latent_space() == v1::LATENT_SPACE_RAW) {
      return BadQueryParam("latent_space", "raw (the model's own formula) contradicts scaling_factor/shift_factor");
    }
    if (r.posterior() == v1::POSTERIOR_MOMENTS) {
      return BadQueryParam("posterior",
                           "moments are returned as the encoder makes them: no scaling_factor/shift_factor");
    }
  }

  // The image: a file (no shape), or a tensor (shape and dtype).
  ASSIGN_OR_RETURN(const std::string* dtype, SingleQueryParam(params, "dtype"));
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, RepeatedPositiveQueryParam(params, "shape"));
  if (shape.empty()) {
    if (dtype != nullptr) return BadQueryParam("shape", "missing; a tensor body needs shape=...&shape=... and dtype");
    r.set_encoded_image(std::move(body));
    return call;
  }
  if (dtype == nullptr) return BadQueryParam("dtype", "missing; float32, float16, bfloat16 or uint8");
  v1::Tensor* image = r.mutable_image();
  if (*dtype == "float32") {
    image->set_dtype(v1::FLOAT32);
  } else if (*dtype == "float16") {
    image->set_dtype(v1::FLOAT16);
  } else if (*dtype == "bfloat16") {
    image->set_dtype(v1::BFLOAT16);
  } else if (*dtype == "uint8") {
    image->set_dtype(v1::UINT8);
  } else {
    return BadQueryParam("dtype", absl::StrCat("\"", *dtype, "\"; use float32, float16, bfloat16 or uint8"));
  }
  for (int64_t d : shape) image->add_shape(d);
  image->set_data(std::move(body));
  return call;
}

HttpReply BuildRemoteEncodeReply(const RemoteEncodeCall& call, CollectedOutput output) {
  if (!output.status.ok()) return ErrorReply(output.status);
  const v1::Header& h = output.header;
  if (h.dtype() != v1::FLOAT32) return ErrorReply(absl::InternalError("an encode's output is not float32"));
  std::vector<int64_t> shape(h.shape().begin(), h.shape().end());
  if (call.scaling_factor || call.shift_factor) {
    // (z - shift) · scale in float32, as the pipelines write it on a float32 latent.
    const float shift = static_cast<float>(call.shift_factor.value_or(0.0));
    const float scale = static_cast<float>(call.scaling_factor.value_or(1.0));
    const size_t n = output.tensor.size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, output.tensor.data() + i * sizeof(float), sizeof(float));
      v = (v - shift) * scale;
      std::memcpy(output.tensor.data() + i * sizeof(float), &v, sizeof(float));
    }
  }
  HttpReply reply = TensorReply(std::move(output.tensor), shape, "float32");
  AddCallHeaders(output.request_id, v1::Mode_Name(h.mode()), output.trailer.timings().decode_ms(),
                 output.trailer.timings().queue_ms(), reply);
  if (h.has_sample_seed()) reply.headers.emplace_back("X-Vaedecode-Sample-Seed", absl::StrCat(h.sample_seed()));
  return reply;
}

}  // namespace vaedecode::server
