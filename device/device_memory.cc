#include "device/device_memory.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "device/counting_cpu_allocator.h"
#include "device/cuda_memory.h"
#include "rpc/status_macros.h"

namespace vaedecode::device {
namespace {

class CpuDeviceMemory final : public DeviceMemory {
 public:
  CpuDeviceMemory() : allocator_(CountingCpuAllocator::Install()) {}

  std::string backend() const override { return "cpu"; }
  int64_t current_bytes() const override { return allocator_.current_bytes(); }
  int64_t peak_bytes() const override { return allocator_.peak_bytes(); }
  void ResetPeak() override { allocator_.ResetPeak(); }
  int64_t free_bytes() const override {
    const int64_t limit = allocator_.limit_bytes();
    return limit <= 0 ? -1 : std::max<int64_t>(0, limit - allocator_.current_bytes());
  }
  // The budget is all there is: free memory is the capacity.
  int64_t capacity_bytes() const override { return free_bytes(); }
  absl::Status SetBudget(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative memory budget ", bytes));
    allocator_.set_limit_bytes(bytes);
    return absl::OkStatus();
  }
  int64_t budget_bytes() const override { return allocator_.limit_bytes(); }

 private:
  CountingCpuAllocator& allocator_;
};

std::mutex g_mutex;
std::atomic<DeviceMemory*> g_installed{nullptr};

}  // namespace

absl::StatusOr<DeviceMemory*> InstallDeviceMemory(const c10::Device& device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (DeviceMemory* existing = g_installed.load()) {
    const bool same_kind = (existing->backend() == "cpu") == device.is_cpu();
    if (!same_kind) {
      return absl::FailedPreconditionError(
          absl::StrCat("device memory accounting is already installed for ", existing->backend()));
    }
    return existing;
  }
  std::unique_ptr<DeviceMemory> memory;
  if (device.is_cpu()) {
    memory = std::make_unique<CpuDeviceMemory>();
  } else if (device.is_cuda()) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> cuda, NewCudaDeviceMemory(device.index()));
    memory = std::move(cuda);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("no memory accounting for device ", device.str()));
  }
  g_installed.store(memory.release());  // process lifetime
  return g_installed.load();
}

DeviceMemory* ProcessDeviceMemory() { return g_installed.load(); }

}  // namespace vaedecode::device
