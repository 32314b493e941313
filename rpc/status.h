#pragma once

// The one place where absl::Status and grpc::Status meet, for the server and
// the workers alike. Inside a process everything is absl::Status; it becomes
// a grpc::Status only when a call is finished, and a grpc::Status from the
// other side becomes an absl::Status as soon as it is read. Codes map one to
// one (both follow google.rpc.Code).
//
// Thread-safe: pure functions.

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace vaedecode::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A call's deadline; absl::InfiniteFuture() when it has none.
absl::Time CallDeadline(const grpc::ServerContextBase& context);

// "OK", "INVALID_ARGUMENT", ...: the label value used in metrics and logs.
std::string StatusCodeName(absl::StatusCode code);

}  // namespace vaedecode::rpc
