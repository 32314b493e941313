#include "worker/runtime_info.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/headeronly/version.h>

#include "absl/strings/str_cat.h"

namespace vaedecode::worker {

std::string LibTorchSummary() {
  at::Context& context = at::globalContext();
  return absl::StrCat("LibTorch ", TORCH_VERSION, ", BLAS ", context.hasMKL() ? "MKL" : "other than MKL",
                      context.hasMKLDNN() ? ", oneDNN" : "", ", ", at::get_num_threads(), " CPU threads");
}

}  // namespace vaedecode::worker
