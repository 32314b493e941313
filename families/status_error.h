#pragma once

// An exception that carries an absl::Status through a decoder's forward pass
// (LayerOps return tensors, so a failed collective has to unwind). It never
// leaves the process: worker/decode_job.cc catches it and returns the Status.

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

}  // namespace vaedecode::families
