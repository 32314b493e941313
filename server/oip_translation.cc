#include "server/oip_translation.h"

#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/modes.h"
#include "rpc/output_formats.h"
#include "rpc/request_options.h"
#include "rpc/status_macros.h"

namespace vaedecode::server {
namespace {

constexpr char kInput[] = "latent";
constexpr char kOutput[] = "sample";
constexpr char kEncodeInput[] = "image";
constexpr char kEncodeOutput[] = "latent";
constexpr char kOperation[] = "operation";
// A decode's second input: an audio latent muxed into the MP4 (its model is
// the request option audio_model).
constexpr char kAudioInput[] = "audio_latent";
// Triton's request parameters that clients may send: not ours to refuse.
const std::set<std::string>& TritonParameters() {
  static const auto* names = new std::set<std::string>{"sequence_id", "sequence_start",     "sequence_end", "priority",
                                                       "timeout",     "binary_data_output", "headers"};
  return *names;
}

absl::Status BadParameter(const std::string& name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("parameter \"", name, "\": ", why));
}

bool HasTypedContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() > 0 || c.int_contents_size() > 0 || c.int64_contents_size() > 0 ||
         c.uint_contents_size() > 0 || c.uint64_contents_size() > 0 || c.fp32_contents_size() > 0 ||
         c.fp64_contents_size() > 0 || c.bytes_contents_size() > 0;
}

// The parameter's value as the request options take it.
rpc::OptionValue ValueOf(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam:
      return p.bool_param();
    case inference::InferParameter::kInt64Param:
      return p.int64_param();
    case inference::InferParameter::kUint64Param:
      return p.uint64_param();
    case inference::InferParameter::kDoubleParam:
      return p.double_param();
    case inference::InferParameter::kStringParam:
      return p.string_param();
    default:
      return false;  // no value: refused by every option
  }
}

// Applies one request parameter to `r`: a request option
// (rpc/request_options.h) or one of Triton's own, which are ignored.
absl::Status ApplyParameter(const std::string& name, const inference::InferParameter& p, v1::DecodeRequest& r) {
  const rpc::OptionInfo* option = rpc::FindRequestOption(name);
  if (option != nullptr && option->name == name && (option->surfaces & rpc::kOip) != 0) {
    if (absl::Status s = rpc::SetOption(*option, ValueOf(p), r); !s.ok()) {
      return BadParameter(name, s.message().substr(name.size() + 2));  // "name: why" -> why
    }
    return absl::OkStatus();
  }
  if (TritonParameters().count(name) > 0 || name == kOperation) return absl::OkStatus();
  std::vector<std::string> names;
  for (const rpc::OptionInfo& o : rpc::RequestOptions()) {
    if ((o.surfaces & rpc::kOip) != 0) names.push_back(o.name);
  }
  return BadParameter(name, absl::StrCat("unknown; vaedecode takes ", absl::StrJoin(names, ", "), " and ", kOperation));
}

// The same for an encode: an rpc::EncodeOptions() row, or Triton's own.
absl::Status ApplyEncodeParameter(const std::string& name, const inference::InferParameter& p, v1::EncodeRequest& r) {
  std::vector<std::string> names;
  for (const rpc::OptionInfo& option : rpc::EncodeOptions()) {
    if ((option.surfaces & rpc::kOip) == 0) continue;
    names.push_back(option.name);
    if (option.name != name) continue;
    if (absl::Status s = rpc::SetOption(option, ValueOf(p), r); !s.ok()) {
      return BadParameter(name, s.message().substr(name.size() + 2));  // "name: why" -> why
    }
    return absl::OkStatus();
  }
  if (TritonParameters().count(name) > 0 || name == kOperation) return absl::OkStatus();
  return BadParameter(
      name, absl::StrCat("unknown for an encode; vaedecode takes ", absl::StrJoin(names, ", "), " and ", kOperation));
}

// The input named `input_name` (and the one named `optional_input`, when
// given and sent), each once, and outputs named `output_name` only (with no
// parameters but the HTTP binding's binary_data).
absl::Status CheckInputsAndOutputs(const inference::ModelInferRequest& request, const v1::ModelInfo& model,
                                   const char* input_name, const char* output_name,
                                   const char* optional_input = nullptr) {
  std::vector<std::string> names;
  int required = 0, optional = 0;
  for (const auto& in : request.inputs()) {
    names.push_back(absl::StrCat("\"", in.name(), "\""));
    required += in.name() == input_name ? 1 : 0;
    optional += optional_input != nullptr && in.name() == optional_input ? 1 : 0;
  }
  if (required != 1 || optional > 1 || required + optional != request.inputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs: expected one input \"", input_name, "\"",
                     optional_input != nullptr ? absl::StrCat(" (and optionally \"", optional_input, "\")") : "",
                     ", got [", absl::StrJoin(names, ", "), "]"));
  }
  for (const auto& out : request.outputs()) {
    if (out.name() != output_name) {
      return absl::InvalidArgumentError(absl::StrCat("outputs: \"", out.name(), "\" is not an output of model \"",
                                                     model.name(), "\"; it has \"", output_name, "\""));
    }
    for (const auto& [name, value] : out.parameters()) {
      // binary_data is the HTTP binding's choice of encoding, decided there.
      if (name == "binary_data") continue;
      return absl::InvalidArgumentError(
          absl::StrCat("output \"", output_name, "\": parameter \"", name, "\" is not supported",
                       name == "classification" ? " (a decoded image has no classes)" : "",
                       name.rfind("shared_memory", 0) == 0 ? " (shared memory is not served)" : "",
                       "; the output's form is the request parameter output_format"));
    }
  }
  for (const auto& input : request.inputs()) {
    for (const auto& [name, value] : input.parameters()) {
      // binary_data_size: the HTTP binding's framing, consumed there.
      if (name == "binary_data_size") continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "input \"", input.name(), "\": parameter \"", name, "\" is not supported",
          name.rfind("shared_memory", 0) == 0 ? " (shared memory is not served: send the tensor's bytes)" : ""));
    }
    if (request.raw_input_contents_size() > 0 && HasTypedContents(input.contents())) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", input.name(),
                                                     "\": both raw_input_contents and typed contents; send the tensor "
                                                     "once (the protocol allows one or the other)"));
    }
  }
  if (request.raw_input_contents_size() > 0 && request.raw_input_contents_size() != request.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("raw_input_contents: ", request.raw_input_contents_size(),
                                                   " entries for ", request.inputs_size(), " input(s)"));
  }
  return absl::OkStatus();
}

// Where the input named `name` is among the request's (-1: not sent).
int InputIndex(const inference::ModelInferRequest& request, const char* name) {
  for (int i = 0; i < request.inputs_size(); ++i) {
    if (request.inputs(i).name() == name) return i;
  }
  return -1;
}

// Input `index`'s bytes into `data`: raw_input_contents, or fp32_contents for FP32.
absl::Status ReadInputData(const inference::ModelInferRequest& request, int index, std::string* data) {
  const auto& input = request.inputs(index);
  const std::string& input_name = input.name();
  if (request.raw_input_contents_size() > 0) {
    *data = request.raw_input_contents(index);
    return absl::OkStatus();
  }
  if (input.datatype() == "FP32" && input.contents().fp32_contents_size() > 0) {
    const auto& values = input.contents().fp32_contents();
    data->resize(static_cast<size_t>(values.size()) * 4);
    std::memcpy(data->data(), values.data(), static_cast<size_t>(values.size()) * 4);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input \"", input_name, "\": no data (send raw_input_contents, or fp32_contents for FP32)"));
}

// A latent input (FP32, FP16 or BF16) as a v1::Tensor.
absl::Status ReadLatentInput(const inference::ModelInferRequest& request, int index, v1::Tensor* latent) {
  const auto& input = request.inputs(index);
  if (input.datatype() == "FP32") {
    latent->set_dtype(v1::FLOAT32);
  } else if (input.datatype() == "FP16") {
    latent->set_dtype(v1::FLOAT16);
  } else if (input.datatype() == "BF16") {
    latent->set_dtype(v1::BFLOAT16);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("input \"", input.name(), "\": datatype ", input.datatype(), "; use FP32, FP16 or BF16"));
  }
  for (int64_t d : input.shape()) latent->add_shape(d);
  return ReadInputData(request, index, latent->mutable_data());
}

// Triton's BYTES tensors on the wire: each element a 4-byte little-endian
// length, then its bytes.
std::string SerializeBytesTensor(const std::vector<std::string>& elements) {
  size_t total = 0;
  for (const std::string& e : elements) total += 4 + e.size();
  std::string out;
  out.reserve(total);
  for (const std::string& e : elements) {
    const uint32_t n = static_cast<uint32_t>(e.size());
    const char length[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                            static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
    out.append(length, 4);
    out.append(e);
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::DecodeRequest> TranslateModelInfer(const inference::ModelInferRequest& request,
                                                      const v1::ModelInfo& model) {
  v1::DecodeRequest r;
  r.set_model(model.name());
  r.set_request_id(request.id());
  RETURN_IF_ERROR(CheckInputsAndOutputs(request, model, kInput, kOutput, kAudioInput));
  RETURN_IF_ERROR(ReadLatentInput(request, InputIndex(request, kInput), r.mutable_latent()));
  if (const int audio = InputIndex(request, kAudioInput); audio >= 0) {
    RETURN_IF_ERROR(ReadLatentInput(request, audio, r.mutable_audio_latent()));
  }
  for (const auto& [name, value] : request.parameters()) {
    RETURN_IF_ERROR(ApplyParameter(name, value, r));
  }
  return r;
}

absl::StatusOr<InferOperation> OperationOf(const inference::ModelInferRequest& request) {
  const auto found = request.parameters().find(kOperation);
  if (found == request.parameters().end()) return InferOperation::kDecode;
  const inference::InferParameter& p = found->second;
  if (p.parameter_choice_case() == inference::InferParameter::kStringParam) {
    if (p.string_param() == "decode") return InferOperation::kDecode;
    if (p.string_param() == "encode") return InferOperation::kEncode;
  }
  return BadParameter(kOperation, "use \"decode\" (the default) or \"encode\" (a string)");
}

absl::StatusOr<v1::EncodeRequest> TranslateModelInferEncode(const inference::ModelInferRequest& request,
                                                            const v1::ModelInfo& model) {
  v1::EncodeRequest r;
  r.set_model(model.name());
  r.set_request_id(request.id());
  RETURN_IF_ERROR(CheckInputsAndOutputs(request, model, kEncodeInput, kEncodeOutput));
  const auto& input = request.inputs(0);
  if (input.datatype() == "BYTES") {
    // One element: a PNG or JPEG file (typed bytes_contents, or Triton's
    // raw BYTES framing: a 4-byte little-endian length, then the bytes).
    if (input.shape_size() != 1 || input.shape(0) != 1) {
      return absl::InvalidArgumentError("input \"image\": BYTES holds one PNG or JPEG file: shape [1]");
    }
    if (input.contents().bytes_contents_size() == 1 && request.raw_input_contents_size() == 0) {
      r.set_encoded_image(input.contents().bytes_contents(0));
    } else if (request.raw_input_contents_size() == 1) {
      const std::string& raw = request.raw_input_contents(0);
      const uint32_t n = raw.size() < 4 ? 0
                                        : static_cast<uint32_t>(static_cast<uint8_t>(raw[0])) |
                                              static_cast<uint32_t>(static_cast<uint8_t>(raw[1])) << 8 |
                                              static_cast<uint32_t>(static_cast<uint8_t>(raw[2])) << 16 |
                                              static_cast<uint32_t>(static_cast<uint8_t>(raw[3])) << 24;
      if (raw.size() < 4 || raw.size() - 4 != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("input \"image\": BYTES raw contents are one 4-byte length and that many bytes; got ",
                         raw.size(), " bytes"));
      }
      r.set_encoded_image(raw.substr(4));
    } else {
      return absl::InvalidArgumentError("input \"image\": no file (send one bytes_contents element)");
    }
  } else {
    v1::Tensor* image = r.mutable_image();
    if (input.datatype() == "FP32") {
      image->set_dtype(v1::FLOAT32);
    } else if (input.datatype() == "FP16") {
      image->set_dtype(v1::FLOAT16);
    } else if (input.datatype() == "BF16") {
      image->set_dtype(v1::BFLOAT16);
    } else if (input.datatype() == "UINT8") {
      image->set_dtype(v1::UINT8);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("input \"image\": datatype ", input.datatype(), "; use FP32, FP16, BF16, UINT8 or BYTES"));
    }
    for (int64_t d : input.shape()) image->add_shape(d);
    RETURN_IF_ERROR(ReadInputData(request, 0, image->mutable_data()));
  }
  for (const auto& [name, value] : request.parameters()) {
    RETURN_IF_ERROR(ApplyEncodeParameter(name, value, r));
  }
  return r;
}

absl::Status FillModelInferResponse(CollectedOutput output, inference::ModelInferResponse* response,
                                    InferOperation operation) {
  if (!output.status.ok()) return output.status;
  const v1::Header& h = output.header;
  response->set_id(output.request_id);
  const rpc::OutputFormatInfo* format = rpc::FindOutputFormat(h.output_format());
  if (format == nullptr) return absl::InternalError("the group's header has an unknown output format");
  auto* out = response->add_outputs();
  out->set_name(operation == InferOperation::kEncode ? kEncodeOutput : kOutput);
  out->set_datatype(format->oip_datatype);
  if (format->encoded) {
    out->add_shape(static_cast<int64_t>(output.images.size()));
    response->add_raw_output_contents(SerializeBytesTensor(output.images));
  } else {
    for (int64_t d : h.shape()) out->add_shape(d);
    response->add_raw_output_contents(std::move(output.tensor));
  }
  (*response->mutable_parameters())["mode"].set_string_param(v1::Mode_Name(h.mode()));
  (*response->mutable_parameters())["degree"].set_int64_param(h.degree());
  (*response->mutable_parameters())["decode_ms"].set_double_param(output.trailer.timings().decode_ms());
  (*response->mutable_parameters())["queue_ms"].set_double_param(output.trailer.timings().queue_ms());
  if (h.has_noise_seed()) (*response->mutable_parameters())["noise_seed"].set_uint64_param(h.noise_seed());
  if (h.has_sample_seed()) (*response->mutable_parameters())["sample_seed"].set_uint64_param(h.sample_seed());
  if (h.sample_rate() > 0) (*response->mutable_parameters())["sample_rate"].set_int64_param(h.sample_rate());
  return absl::OkStatus();
}

namespace {

// [B, C, (T,) H, W] with -1 for what any request may choose; an audio
// VAE's [B, C, L] or [B, C, L, M].
std::vector<int64_t> LatentDims(const v1::ModelInfo& model) {
  if (model.is_audio()) {
    return model.latent_bins() > 0 ? std::vector<int64_t>{-1, model.latent_channels(), -1, -1}
                                   : std::vector<int64_t>{-1, model.latent_channels(), -1};
  }
  return model.is_video() ? std::vector<int64_t>{-1, model.latent_channels(), -1, -1, -1}
                          : std::vector<int64_t>{-1, model.latent_channels(), -1, -1};
}

// An audio VAE's default output: the waveform [B, channels, samples], or
// without a vocoder the mel spectrogram [B, C, frames, mel_bins].
std::vector<int64_t> SampleDims(const v1::ModelInfo& model) {
  if (model.is_audio()) {
    return model.sample_rate() > 0 ? std::vector<int64_t>{-1, model.out_channels(), -1}
                                   : std::vector<int64_t>{-1, model.out_channels(), -1, -1};
  }
  std::vector<int64_t> dims = LatentDims(model);
  dims[1] = model.out_channels();
  return dims;
}

}  // namespace

inference::ModelMetadataResponse DescribeModel(const v1::ModelInfo& model) {
  inference::ModelMetadataResponse m;
  m.set_name(model.name());
  m.add_versions("1");
  m.set_platform(absl::StrCat("vaedecode_", model.family()));
  // One datatype per tensor is all the protocol's metadata can say: the
  // defaults. ModelConfig's parameters list every datatype served.
  auto* in = m.add_inputs();
  in->set_name(kInput);
  in->set_datatype("FP32");
  for (int64_t d : LatentDims(model)) in->add_shape(d);
  auto* out = m.add_outputs();
  out->set_name(kOutput);
  out->set_datatype("FP32");
  for (int64_t d : SampleDims(model)) out->add_shape(d);
  return m;
}

inference::ModelConfig DescribeConfig(const v1::ModelInfo& model) {
  inference::ModelConfig c;
  c.set_name(model.name());
  c.set_platform(absl::StrCat("vaedecode_", model.family()));
  c.set_backend("vaedecode");
  c.set_max_batch_size(0);  // the batch is the latent's first dimension, in dims
  auto* in = c.add_input();
  in->set_name(kInput);
  in->set_data_type(inference::TYPE_FP32);
  in->set_format(model.is_video() || model.is_audio() ? inference::ModelInput::FORMAT_NONE
                                                      : inference::ModelInput::FORMAT_NCHW);
  for (int64_t d : LatentDims(model)) in->add_dims(d);
  auto* out = c.add_output();
  out->set_name(kOutput);
  out->set_data_type(inference::TYPE_FP32);
  for (int64_t d : SampleDims(model)) out->add_dims(d);
  auto& p = *c.mutable_parameters();
  p["latent_datatypes"].set_string_value("FP32,FP16,BF16");
  p["sample_datatypes"].set_string_value(
      "FP32 (output_format float32, the default), FP16 (float16), UINT8 (uint8, channels last), "
      "BYTES (png, jpeg: one file per image or frame; mp4: one video per batch entry; wav, wav_float32: one WAV "
      "per batch entry)");
  p["diffusers_class"].set_string_value(model.diffusers_class());
  p["dtype"].set_string_value(model.dtype());
  p["raw_to_vae"].set_string_value(model.raw_to_vae_formula());
  if (model.sample_rate() > 0) p["sample_rate"].set_string_value(absl::StrCat(model.sample_rate()));
  return c;
}

}  // namespace vaedecode::server
