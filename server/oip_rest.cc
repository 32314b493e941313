#include "server/oip_rest.h"

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "rpc/status_macros.h"

namespace vaedecode::server {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A JSON parameter value as the protocol's InferParameter.
absl::StatusOr<inference::InferParameter> ToParameter(const std::string& name, const Json& value) {
  inference::InferParameter p;
  if (value.is_boolean()) {
    p.set_bool_param(value.get<bool>());
  } else if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      p.set_int64_param(static_cast<int64_t>(v));
    } else {
      p.set_uint64_param(v);
    }
  } else if (value.is_number_integer()) {
    p.set_int64_param(value.get<int64_t>());
  } else if (value.is_number_float()) {
    p.set_double_param(value.get<double>());
  } else if (value.is_string()) {
    p.set_string_param(value.get_ref<const std::string&>());
  } else {
    return Bad(absl::StrCat("parameter \"", name, "\""), "must be a bool, a number or a string");
  }
  return p;
}

absl::Status ReadParameters(const Json& object, absl::string_view where,
                            google::protobuf::Map<std::string, inference::InferParameter>* out) {
  if (!object.is_object()) return Bad(absl::StrCat(where, " parameters"), "must be a JSON object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    ASSIGN_OR_RETURN(inference::InferParameter p, ToParameter(it.key(), it.value()));
    (*out)[it.key()] = std::move(p);
  }
  return absl::OkStatus();
}

// The numbers of `data` (nested lists, at most 8 deep) as float32 bytes.
absl::StatusOr<std::string> Float32Data(const Json& data) {
  constexpr int kMaxDepth = 8;
  std::string bytes;
  // An explicit stack: no recursion on the client's nesting.
  std::vector<std::pair<const Json*, size_t>> stack = {{&data, 0}};
  if (!data.is_array()) return Bad("input \"latent\" data", "must be a list of numbers");
  while (!stack.empty()) {
    auto& [array, next] = stack.back();
    if (next == array->size()) {
      stack.pop_back();
      continue;
    }
    const Json& item = (*array)[next++];
    if (item.is_array()) {
      if (static_cast<int>(stack.size()) >= kMaxDepth) {
        return Bad("input \"latent\" data", absl::StrCat("lists nested deeper than ", kMaxDepth));
      }
      stack.emplace_back(&item, 0);
    } else if (item.is_number()) {
      const float v = static_cast<float>(item.get<double>());
      char raw[4];
      std::memcpy(raw, &v, 4);
      bytes.append(raw, 4);
    } else {
      return Bad("input \"latent\" data", "holds something that is not a number");
    }
  }
  return bytes;
}

Json ParameterJson(const inference::InferParameter& p) {
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
      return nullptr;
  }
}

template <typename Repeated>
Json List(const Repeated& values) {
  Json list = Json::array();
  for (const auto& v : values) list.push_back(v);
  return list;
}

Json Duration(const inference::StatisticDuration& d) { return {{"count", d.count()}, {"ns", d.ns()}}; }

}  // namespace

absl::StatusOr<RestInferRequest> ParseRestInferRequest(const std::string& body, int64_t header_length,
                                                       const std::string& name, const std::string& version) {
  if (header_length < -1 || header_length > static_cast<int64_t>(body.size())) {
    return Bad("Inference-Header-Content-Length",
               absl::StrCat(header_length, " is not a length within the body's ", body.size(), " bytes"));
  }
  const size_t json_length = header_length < 0 ? body.size() : static_cast<size_t>(header_length);
  const Json header = Json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(json_length), nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad("the request",
               "its JSON header is not a JSON object (with binary tensors, "
               "Inference-Header-Content-Length gives the JSON's length)");
  }
  RestInferRequest out;
  inference::ModelInferRequest& r = out.request;
  r.set_model_name(name);
  r.set_model_version(version);
  if (auto id = header.find("id"); id != header.end()) {
    if (!id->is_string()) return Bad("id", "must be a string");
    r.set_id(id->get_ref<const std::string&>());
  }
  if (auto params = header.find("parameters"); params != header.end()) {
    RETURN_IF_ERROR(ReadParameters(*params, "request", r.mutable_parameters()));
  }
  auto inputs = header.find("inputs");
  if (inputs == header.end() || !inputs->is_array() || inputs->empty()) {
    return Bad("inputs", "missing; a list with the input \"latent\"");
  }
  size_t offset = json_length;  // the next binary tensor
  bool any_binary = false;
  for (const Json& input : *inputs) {
    if (!input.is_object()) return Bad("inputs", "each input must be a JSON object");
    auto* t = r.add_inputs();
    auto field = input.find("name");
    if (field == input.end() || !field->is_string()) return Bad("input", "needs a \"name\" string");
    t->set_name(field->get_ref<const std::string&>());
    const std::string where = absl::StrCat("input \"", t->name(), "\"");
    field = input.find("datatype");
    if (field == input.end() || !field->is_string()) return Bad(where, "needs a \"datatype\" string");
    t->set_datatype(field->get_ref<const std::string&>());
    field = input.find("shape");
    if (field == input.end() || !field->is_array()) return Bad(where, "needs a \"shape\" list");
    for (const Json& d : *field) {
      if (!d.is_number_integer() ||
          (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
        return Bad(where, "its shape must hold integers");
      }
      t->add_shape(d.get<int64_t>());
    }
    if (field = input.find("parameters"); field != input.end()) {
      RETURN_IF_ERROR(ReadParameters(*field, where, t->mutable_parameters()));
    }
    auto size = t->parameters().find("binary_data_size");
    auto data = input.find("data");
    if (size != t->parameters().end()) {
      if (data != input.end()) return Bad(where, "has both \"data\" and binary_data_size; send it once");
      if (header_length < 0) {
        return Bad(where, "binary_data_size needs the Inference-Header-Content-Length header");
      }
      const inference::InferParameter& p = size->second;
      if (p.parameter_choice_case() != inference::InferParameter::kInt64Param || p.int64_param() < 0 ||
          static_cast<uint64_t>(p.int64_param()) > body.size() - offset) {
        return Bad(where, absl::StrCat("binary_data_size must be a byte count within the ", body.size() - offset,
                                       " bytes left after the JSON"));
      }
      const size_t n = static_cast<size_t>(p.int64_param());
      r.add_raw_input_contents(body.substr(offset, n));
      offset += n;
      any_binary = true;
    } else if (data != input.end()) {
      if (t->datatype() != "FP32") {
        return Bad(where, absl::StrCat(t->datatype(), " data has no JSON form here; send it as binary data"));
      }
      ASSIGN_OR_RETURN(std::string bytes, Float32Data(*data));
      r.add_raw_input_contents(std::move(bytes));
    } else {
      return Bad(where, "has no \"data\" and no binary_data_size");
    }
  }
  if (offset != body.size()) {
    return Bad("the request", absl::StrCat(body.size() - offset, " bytes after the JSON are no input's ",
                                           any_binary ? "(binary_data_size sums to less)" : "binary data"));
  }
  bool binary = false;
  if (auto p = r.parameters().find("binary_data_output"); p != r.parameters().end()) {
    binary = p->second.parameter_choice_case() == inference::InferParameter::kBoolParam && p->second.bool_param();
  }
  if (auto outputs = header.find("outputs"); outputs != header.end()) {
    if (!outputs->is_array()) return Bad("outputs", "must be a list");
    for (const Json& output : *outputs) {
      if (!output.is_object()) return Bad("outputs", "each output must be a JSON object");
      auto* o = r.add_outputs();
      auto field = output.find("name");
      if (field == output.end() || !field->is_string()) return Bad("output", "needs a \"name\" string");
      o->set_name(field->get_ref<const std::string&>());
      if (field = output.find("parameters"); field != output.end()) {
        const std::string where = absl::StrCat("output \"", o->name(), "\"");
        RETURN_IF_ERROR(ReadParameters(*field, where, o->mutable_parameters()));
      }
      if (auto p = o->parameters().find("binary_data"); p != o->parameters().end()) {
        binary = p->second.parameter_choice_case() == inference::InferParameter::kBoolParam && p->second.bool_param();
      }
    }
  }
  out.binary_output = binary;
  if (!binary) {
    // Only tensors of numbers have a JSON form: refused now, not after the decode.
    if (auto p = r.parameters().find("output_format");
        p != r.parameters().end() && p->second.parameter_choice_case() == inference::InferParameter::kStringParam) {
      const std::string& f = p->second.string_param();
      if (f != "float32" && f != "uint8") {
        return Bad("outputs", absl::StrCat("output_format ", f,
                                           " has no JSON form; ask for the output as binary "
                                           "data (binary_data: true)"));
      }
    }
  }
  return out;
}

absl::StatusOr<HttpReply> BuildRestInferReply(const inference::ModelInferResponse& response, bool binary_output) {
  Json header = {{"model_name", response.model_name()}, {"model_version", response.model_version()}};
  if (!response.id().empty()) header["id"] = response.id();
  Json parameters = Json::object();
  for (const auto& [name, value] : response.parameters()) parameters[name] = ParameterJson(value);
  header["parameters"] = parameters;
  header["outputs"] = Json::array();
  std::string binary;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& o = response.outputs(i);
    Json out = {{"name", o.name()}, {"datatype", o.datatype()}, {"shape", List(o.shape())}};
    const std::string empty;
    const std::string& raw = i < response.raw_output_contents_size() ? response.raw_output_contents(i) : empty;
    if (binary_output) {
      out["parameters"] = {{"binary_data_size", raw.size()}};
      binary += raw;
    } else if (o.datatype() == "FP32") {
      Json data = Json::array();
      for (size_t k = 0; k + 4 <= raw.size(); k += 4) {
        float v;
        std::memcpy(&v, raw.data() + k, 4);
        data.push_back(v);
      }
      out["data"] = std::move(data);
    } else if (o.datatype() == "UINT8") {
      Json data = Json::array();
      for (char c : raw) data.push_back(static_cast<uint8_t>(c));
      out["data"] = std::move(data);
    } else {
      return Bad(absl::StrCat("output \"", o.name(), "\""),
                 absl::StrCat(o.datatype(), " has no JSON form; ask for it as binary data (binary_data: true)"));
    }
    header["outputs"].push_back(std::move(out));
  }
  HttpReply reply;
  const std::string json = Dump(header);
  if (binary_output) {
    reply.content_type = "application/octet-stream";
    reply.headers.emplace_back("Inference-Header-Content-Length", absl::StrCat(json.size()));
    reply.body = json + binary;
  } else {
    reply.content_type = "application/json";
    reply.body = json;
  }
  return reply;
}

std::string ServerMetadataJson(const inference::ServerMetadataResponse& m) {
  return Dump({{"name", m.name()}, {"version", m.version()}, {"extensions", List(m.extensions())}});
}

std::string ModelMetadataJson(const inference::ModelMetadataResponse& m) {
  const auto tensors = [](const auto& list) {
    Json out = Json::array();
    for (const auto& t : list)
      out.push_back({{"name", t.name()}, {"datatype", t.datatype()}, {"shape", List(t.shape())}});
    return out;
  };
  return Dump({{"name", m.name()},
               {"versions", List(m.versions())},
               {"platform", m.platform()},
               {"inputs", tensors(m.inputs())},
               {"outputs", tensors(m.outputs())}});
}

std::string ModelConfigJson(const inference::ModelConfig& c) {
  Json inputs = Json::array(), outputs = Json::array(), parameters = Json::object();
  for (const auto& t : c.input()) {
    inputs.push_back({{"name", t.name()},
                      {"data_type", inference::DataType_Name(t.data_type())},
                      {"format", inference::ModelInput::Format_Name(t.format())},
                      {"dims", List(t.dims())}});
  }
  for (const auto& t : c.output()) {
    outputs.push_back(
        {{"name", t.name()}, {"data_type", inference::DataType_Name(t.data_type())}, {"dims", List(t.dims())}});
  }
  for (const auto& [name, value] : c.parameters()) parameters[name] = {{"string_value", value.string_value()}};
  return Dump({{"name", c.name()},
               {"platform", c.platform()},
               {"backend", c.backend()},
               {"max_batch_size", c.max_batch_size()},
               {"input", inputs},
               {"output", outputs},
               {"parameters", parameters}});
}

std::string ModelStatisticsJson(const inference::ModelStatisticsResponse& statistics) {
  Json models = Json::array();
  for (const auto& s : statistics.model_stats()) {
    const auto& i = s.inference_stats();
    models.push_back({{"name", s.name()},
                      {"version", s.version()},
                      {"last_inference", s.last_inference()},
                      {"inference_count", s.inference_count()},
                      {"execution_count", s.execution_count()},
                      {"inference_stats",
                       {{"success", Duration(i.success())},
                        {"fail", Duration(i.fail())},
                        {"queue", Duration(i.queue())},
                        {"compute_input", Duration(i.compute_input())},
                        {"compute_infer", Duration(i.compute_infer())},
                        {"compute_output", Duration(i.compute_output())}}},
                      {"batch_stats", Json::array()}});
  }
  return Dump({{"model_stats", models}});
}

std::string RepositoryIndexJson(const inference::RepositoryIndexResponse& index) {
  Json models = Json::array();
  for (const auto& m : index.models()) {
    Json entry = {{"name", m.name()}, {"version", m.version()}, {"state", m.state()}};
    if (!m.reason().empty()) entry["reason"] = m.reason();
    models.push_back(std::move(entry));
  }
  return Dump(models);
}

absl::StatusOr<bool> ParseRepositoryIndexRequest(const std::string& body) {
  if (body.empty()) return false;
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("the request", "must be a JSON object");
  auto ready = j.find("ready");
  if (ready == j.end()) return false;
  if (!ready->is_boolean()) return Bad("ready", "must be true or false");
  return ready->get<bool>();
}

}  // namespace vaedecode::server
