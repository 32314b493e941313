#pragma once

#include <string>

namespace vaedecode::worker {

// What LibTorch this process runs and how it computes, for start-up logs and
// `vaedecode info`: e.g. "LibTorch 2.11.0, BLAS MKL, oneDNN, 2 CPU threads".
std::string LibTorchSummary();

}  // namespace vaedecode::worker
