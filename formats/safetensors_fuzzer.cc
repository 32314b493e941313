// libFuzzer entry point for the safetensors parser. Also linked into
// safetensors_corpus_test, which replays the seed corpus without clang.
//
// Properties checked beyond "does not crash": every accepted tensor's bytes
// lie inside the buffer (ASan catches a read outside), Find() agrees with
// tensors(), and re-serializing an accepted file gives a file that parses to
// the same tensors.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "formats/safetensors.h"

namespace {

using vaedecode::formats::SafetensorsFile;
using vaedecode::formats::TensorView;

void Require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::FromBuffer(std::string(reinterpret_cast<const char*>(data), size), "fuzz-input");
  if (!file.ok()) {
    Require(!file.status().message().empty());
    Require(file.status().message().find('\n') == std::string::npos);
    return 0;
  }
  uint64_t checksum = 0;
  for (const TensorView& t : (*file)->tensors()) {
    Require(t.nbytes == static_cast<size_t>(t.numel()) * vaedecode::formats::DTypeSize(t.dtype));
    for (size_t i = 0; i < t.nbytes; ++i) checksum += t.data[i];
    Require((*file)->Find(t.name) == &t);
  }
  // Keep the reads from being optimized away.
  volatile uint64_t sink = checksum;
  (void)sink;

  auto bytes = vaedecode::formats::SerializeSafetensors((*file)->tensors(), (*file)->metadata());
  Require(bytes.ok());
  auto again = SafetensorsFile::FromBuffer(std::move(*bytes), "fuzz-roundtrip");
  Require(again.ok());
  Require((*again)->tensors().size() == (*file)->tensors().size());
  Require((*again)->metadata() == (*file)->metadata());
  for (const TensorView& t : (*file)->tensors()) {
    const TensorView* u = (*again)->Find(t.name);
    Require(u != nullptr && u->dtype == t.dtype && u->shape == t.shape && u->nbytes == t.nbytes &&
            (t.nbytes == 0 || std::memcmp(u->data, t.data, t.nbytes) == 0));
  }
  return 0;
}
