#include "device/compute_device.h"

#include <limits>

#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vaedecode::device {

absl::StatusOr<c10::Device> ParseComputeDevice(const std::string& name) {
  const size_t colon = name.find(':');
  const std::string kind = name.substr(0, colon);
  int index = 0;
  const bool has_index = colon != std::string::npos;
  const int max_index = std::numeric_limits<c10::DeviceIndex>::max();
  if (has_index && (!absl::SimpleAtoi(name.substr(colon + 1), &index) || index < 0 || index > max_index)) {
    return absl::InvalidArgumentError(absl::StrCat("device \"", name, "\": the index must be 0..", max_index));
  }
  if (kind == "cpu") return c10::Device(c10::kCPU);
  if (kind == "cuda" && has_index) return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  return absl::InvalidArgumentError(absl::StrCat("device \"", name, "\": expected cpu:N or cuda:N"));
}

absl::Status PrepareComputeDevice(const c10::Device& device) {
  if (device.is_cpu()) return absl::OkStatus();
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device.str(), " is not supported (cpu or cuda)"));
  }
  if (!at::hasCUDA()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device.str(), ": this build has no CUDA backend (build with --config=gpu)"));
  }
  try {
    c10::impl::VirtualGuardImpl guard(c10::kCUDA);
    const int count = guard.deviceCount();
    if (device.index() >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("device ", device.str(), ": this process sees ", count, " GPU(s)"));
    }
    guard.setDevice(device);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("device ", device.str(), ": ", e.what_without_backtrace()));
  }
  // diffusers' references are float32; TF32 would change every conv and matmul.
  // (Process-wide settings: they hold on every thread.) Per operator, with
  // the precision API: setAllowTF32* is deprecated in LibTorch 2.x, and an
  // operator's own setting (convolutions default to TF32) overrides "all".
  for (at::Float32Op op : {at::Float32Op::CONV, at::Float32Op::MATMUL, at::Float32Op::RNN}) {
    at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, op, at::Float32Precision::IEEE);
  }
  return absl::OkStatus();
}

void SynchronizeDevice(const c10::Device& device) {
  if (device.is_cuda()) c10::impl::VirtualGuardImpl(c10::kCUDA).synchronizeDevice(device.index());
}

void UseComputeDevice(const c10::Device& device) {
  if (device.is_cuda()) c10::impl::VirtualGuardImpl(c10::kCUDA).setDevice(device);
}

}  // namespace vaedecode::device
