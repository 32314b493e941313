// libFuzzer entry point for the .npy parser (header literal parser, byte
// swapping, Fortran-order transposition).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto array = vaedecode::formats::ParseNpy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-input");
  if (!array.ok()) {
    if (array.status().message().find('\n') != std::string::npos) std::abort();
    return 0;
  }
  int64_t numel = 1;
  for (int64_t d : array->shape) numel *= d;
  if (array->data.size() != static_cast<size_t>(numel) * vaedecode::formats::DTypeSize(array->dtype)) {
    std::abort();
  }
  return 0;
}
