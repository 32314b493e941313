#pragma once

// Internal to device_memory: the CUDA caching allocator's accounting, from
// cuda_memory.cc under --config=gpu, else cuda_memory_unavailable.cc.

#include <memory>

#include "absl/status/statusor.h"
#include "device/device_memory.h"

namespace vaedecode::device {

absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaDeviceMemory(int index);

}  // namespace vaedecode::device
