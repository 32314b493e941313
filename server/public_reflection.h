#pragma once

// gRPC server reflection (grpc.reflection.v1 and the older v1alpha that
// grpcurl and most tools still use) restricted to the public surface: the
// services this port serves and the .proto files they are defined in, with
// their imports. gRPC's own reflection plugin answers v1alpha only and
// describes any descriptor linked into the binary, including the internal
// server<->worker protocol; this one answers NOT_FOUND for anything else.
//
// Threading: the services are stateless apart from each stream's record of
// the files it has sent; gRPC may run many streams at once.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <set>
#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace vaedecode::server {

// What reflection may describe: `services` (full names, e.g.
// "vaedecode.v1.VaeDecoder") and the transitive imports of their files.
class PublicSurface {
 public:
  // Services unknown to the generated descriptor pool are listed but have no
  // files.
  explicit PublicSurface(std::vector<std::string> services);
  const std::vector<std::string>& services() const { return services_; }
  // Whether `file` (a .proto path) is one of the public files.
  bool Allows(const std::string& file) const { return files_.count(file) > 0; }

 private:
  std::vector<std::string> services_;
  std::set<std::string> files_;
};

class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  explicit ReflectionV1(const PublicSurface& surface) : surface_(surface) {}
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

 private:
  const PublicSurface& surface_;
};

class ReflectionV1Alpha final : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  explicit ReflectionV1Alpha(const PublicSurface& surface) : surface_(surface) {}
  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1alpha::ServerReflectionResponse,
                               grpc::reflection::v1alpha::ServerReflectionRequest>* stream) override;

 private:
  const PublicSurface& surface_;
};

// Every method no registered service serves (gRPC would answer
// UNIMPLEMENTED with an empty message): UNIMPLEMENTED naming the method and
// what the port serves instead, e.g. Triton's RepositoryModelLoad or shared
// memory calls from tritonclient.
class UnservedMethods final : public grpc::CallbackGenericService {
 public:
  explicit UnservedMethods(const PublicSurface& surface) : surface_(surface) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

  // The message for `method` ("/package.Service/Method").
  std::string Explain(const std::string& method) const;

 private:
  const PublicSurface& surface_;
};

}  // namespace vaedecode::server
