#pragma once

// A TCP port free on 127.0.0.1 right now, for a worker group's store: the
// server picks it (it does not link LibTorch) and so do the CLI's local
// groups and the multi-process tests.
//
// Thread-safe: pure function.

#include "absl/status/statusor.h"

namespace vaedecode::rpc {

// Binds 127.0.0.1:0, reads the port the kernel chose and releases it.
// Another process may take the port before it is bound again; callers that
// can retry should.
absl::StatusOr<int> PickFreePort();

}  // namespace vaedecode::rpc
