#pragma once

// The models the protocol fuzzers decode for: one of each shape of request a
// client can meet (image, FLUX.2's packed raw latent, causal video, a
// timestep-conditioned and a windowed video decoder, a float16 model, a
// 4-channel output), picked by a byte of the input; and the check the
// fuzzers assert their properties with.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"

#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

const v1::ModelInfo& FuzzModel(uint8_t selector);

// The fuzz model of that name (a request's audio_model), or NOT_FOUND.
absl::StatusOr<v1::ModelInfo> FuzzModelNamed(const std::string& name);

// Aborts (a crash the fuzzer reports, with its input) unless `condition`.
inline void FuzzRequire(bool condition) {
  if (!condition) std::abort();
}

}  // namespace vaedecode::server
