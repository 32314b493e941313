#include "server/public_reflection.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vaedecode::server {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

void AddWithImports(const FileDescriptor* file, std::set<std::string>& files) {
  if (file == nullptr || !files.insert(file->name()).second) return;
  for (int i = 0; i < file->dependency_count(); ++i) AddWithImports(file->dependency(i), files);
}

// v1 and v1alpha have the same messages in two packages: one implementation.
template <typename Request, typename Response>
class Answerer {
 public:
  explicit Answerer(const PublicSurface& surface) : surface_(surface) {}

  Response Answer(const Request& request) {
    Response response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case Request::kListServices:
        for (const std::string& name : surface_.services()) {
          response.mutable_list_services_response()->add_service()->set_name(name);
        }
        break;
      case Request::kFileByFilename:
        SendFile(pool->FindFileByName(request.file_by_filename()), request.file_by_filename(), response);
        break;
      case Request::kFileContainingSymbol:
        SendFile(pool->FindFileContainingSymbol(request.file_containing_symbol()), request.file_containing_symbol(),
                 response);
        break;
      case Request::kFileContainingExtension: {
        const auto* type = pool->FindMessageTypeByName(request.file_containing_extension().containing_type());
        const auto* extension =
            type == nullptr ? nullptr
                            : pool->FindExtensionByNumber(type, request.file_containing_extension().extension_number());
        SendFile(extension == nullptr ? nullptr : extension->file(),
                 absl::StrCat(request.file_containing_extension().containing_type(), " extension ",
                              request.file_containing_extension().extension_number()),
                 response);
        break;
      }
      case Request::kAllExtensionNumbersOfType: {
        const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr || !surface_.Allows(type->file()->name())) {
          NotFound(request.all_extension_numbers_of_type(), response);
          break;
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* out = response.mutable_all_extension_numbers_response();
        out->set_base_type_name(type->full_name());
        for (const auto* e : extensions) out->add_extension_number(e->number());
        break;
      }
      default:
        response.mutable_error_response()->set_error_code(static_cast<int>(grpc::StatusCode::UNIMPLEMENTED));
        response.mutable_error_response()->set_error_message("unknown reflection request");
    }
    return response;
  }

 private:
  void NotFound(const std::string& what, Response& response) {
    response.mutable_error_response()->set_error_code(static_cast<int>(grpc::StatusCode::NOT_FOUND));
    response.mutable_error_response()->set_error_message(absl::StrCat(what, " not found"));
  }

  // The file and the imports this stream has not sent yet, as the protocol
  // asks; NOT_FOUND for anything outside the public surface.
  void SendFile(const FileDescriptor* file, const std::string& what, Response& response) {
    if (file == nullptr || !surface_.Allows(file->name())) {
      NotFound(what, response);
      return;
    }
    auto* out = response.mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> pending = {file};
    bool first = true;
    while (!pending.empty()) {
      const FileDescriptor* f = pending.back();
      pending.pop_back();
      if (!first && sent_.count(f->name()) > 0) continue;
      first = false;
      sent_.insert(f->name());
      google::protobuf::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(out->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) pending.push_back(f->dependency(i));
    }
  }

  const PublicSurface& surface_;
  std::set<std::string> sent_;
};

template <typename Request, typename Response, typename Stream>
grpc::Status Serve(const PublicSurface& surface, Stream* stream) {
  Answerer<Request, Response> answerer(surface);
  Request request;
  while (stream->Read(&request)) {
    if (!stream->Write(answerer.Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace

PublicSurface::PublicSurface(std::vector<std::string> services) : services_(std::move(services)) {
  for (const std::string& name : services_) {
    const auto* service = DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service != nullptr) AddWithImports(service->file(), files_);
  }
}

grpc::Status ReflectionV1::ServerReflectionInfo(
    grpc::ServerContext*, grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                                                   grpc::reflection::v1::ServerReflectionRequest>* stream) {
  return Serve<grpc::reflection::v1::ServerReflectionRequest, grpc::reflection::v1::ServerReflectionResponse>(surface_,
                                                                                                              stream);
}

grpc::Status ReflectionV1Alpha::ServerReflectionInfo(
    grpc::ServerContext*, grpc::ServerReaderWriter<grpc::reflection::v1alpha::ServerReflectionResponse,
                                                   grpc::reflection::v1alpha::ServerReflectionRequest>* stream) {
  return Serve<grpc::reflection::v1alpha::ServerReflectionRequest, grpc::reflection::v1alpha::ServerReflectionResponse>(
      surface_, stream);
}

}  // namespace vaedecode::server

namespace vaedecode::server {

std::string UnservedMethods::Explain(const std::string& method) const {
  // "/package.Service/Method"
  const size_t slash = method.rfind('/');
  const std::string service = slash == std::string::npos || slash == 0 ? "" : method.substr(1, slash - 1);
  const auto& services = surface_.services();
  if (std::find(services.begin(), services.end(), service) != services.end()) {
    std::vector<std::string> methods;
    if (const google::protobuf::ServiceDescriptor* d =
            google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service)) {
      for (int i = 0; i < d->method_count(); ++i) methods.push_back(d->method(i)->name());
    }
    return absl::StrCat("vaedecode does not serve ", method, "; of ", service, " it serves ",
                        methods.empty() ? std::string("what reflection lists") : absl::StrJoin(methods, ", "));
  }
  return absl::StrCat("vaedecode does not serve ", method, "; its services are ", absl::StrJoin(services, ", "));
}

grpc::ServerGenericBidiReactor* UnservedMethods::CreateReactor(grpc::GenericCallbackServerContext* context) {
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refusal(std::string message) { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, message)); }
    void OnDone() override { delete this; }
  };
  return new Refusal(Explain(context->method()));
}

}  // namespace vaedecode::server
