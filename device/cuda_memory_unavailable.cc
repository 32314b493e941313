#include "device/cuda_memory.h"

namespace vaedecode::device {

absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaDeviceMemory(int index) {
  return absl::UnimplementedError(
      "GPU memory accounting: built without --config=gpu (needs an official CUDA LibTorch; see "
      "deploy/docker/Dockerfile.gpu)");
}

}  // namespace vaedecode::device
