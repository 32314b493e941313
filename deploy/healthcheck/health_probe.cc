// vaedecode_health_probe: one grpc.health.v1.Health/Check call, for container
// HEALTHCHECKs and scripts.
//
//   vaedecode_health_probe --addr=127.0.0.1:50051 --service=vaedecode.v1.VaeDecoder
//
// Exit codes: 0 SERVING; 1 answered but not SERVING (NOT_SERVING, UNKNOWN,
// or NOT_FOUND for a service name the server does not know); 2 no answer
// (connection refused, deadline, bad flags). Prints one line either way.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051", "Server address HOST:PORT");
ABSL_FLAG(std::string, service, "",
          "Health service name: \"\" or vaedecode.v1.VaeDecoder (any group ready), "
          "vaedecode.v1.VaeDecoder/<model> (that model served)");
ABSL_FLAG(double, timeout_s, 3, "Deadline of the call in seconds");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("vaedecode_health_probe --addr=HOST:PORT [--service=NAME]");
  absl::ParseCommandLine(argc, argv);
  const std::string addr = absl::GetFlag(FLAGS_addr);
  const std::string service = absl::GetFlag(FLAGS_service);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (timeout_s <= 0) {
    std::fprintf(stderr, "vaedecode_health_probe: --timeout_s must be positive\n");
    return 2;
  }

  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);

  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    std::printf("%s service=\"%s\": NOT_FOUND (unknown service name)\n", addr.c_str(), service.c_str());
    return 1;
  }
  if (!status.ok()) {
    std::printf("%s service=\"%s\": no answer: %d %s\n", addr.c_str(), service.c_str(),
                static_cast<int>(status.error_code()), status.error_message().c_str());
    return 2;
  }
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s service=\"%s\": %s\n", addr.c_str(), service.c_str(), name.c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}
