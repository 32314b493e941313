#pragma once

// Exceptions and Status: StatusError carries an absl::Status through a
// decoder's forward pass (LayerOps return tensors, so a failed collective has
// to unwind); CatchExceptions turns whatever LibTorch or the standard library
// throws (c10::Error, bad_alloc, length_error) back into a Status, so none
// leaves a call, a thread or the process.

#include <functional>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"

namespace vaedecode::families {

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Calls `fn`, mapping any exception to a Status with `what` as context: a
// StatusError to its status, an out-of-memory to RESOURCE_EXHAUSTED, the
// rest to INTERNAL with the exception's first line.
absl::Status CatchExceptions(const char* what, const std::function<void()>& fn);

}  // namespace vaedecode::families
