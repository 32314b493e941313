#pragma once

// A decode's whole output gathered in the server, for the unary protocols
// (HTTP remote_decode and the OIP bindings), which answer with one message.
// Its own header so the protocols' translations need none of the service.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

struct CollectedOutput {
  absl::Status status;
  std::string request_id;
  v1::Header header;
  v1::Trailer trailer;
  std::string tensor;               // tensor outputs: C order in header.shape, header.dtype
  std::vector<std::string> images;  // PNG / JPEG outputs: one file per image / frame; MP4: one per batch entry
};

}  // namespace vaedecode::server
