#pragma once

#include <string>

namespace vaedecode::worker {

// The BLAS library LibTorch's CPU matmuls resolve to (e.g. "libopenblas.so.0"),
// found among the loaded shared objects; "unknown" when none is loaded.
// Reported because the reference netlib BLAS is ~2x slower than OpenBLAS.
std::string LoadedBlasLibrary();

}  // namespace vaedecode::worker
